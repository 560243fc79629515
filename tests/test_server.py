"""The OpenAI-compatible server, end to end: a real `pagedrt serve` process on 127.0.0.1.

Clients are the official `openai` package and raw httpx (for malformed bodies and for
disconnecting). Expected texts come from `LLM.generate` greedy in this process, with the same
model and engine settings as the server. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import openai
import pytest
from server_process import start_server, stop_server

from pagedrt import LLM, BeamSearchParams, SamplingParams

API_KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct"
ENGINE_KWARGS = {"num_kv_blocks": 256, "max_model_len": 2048}
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory) -> str:
    """Base URL of a `pagedrt serve` subprocess (stopped at the end of the module)."""
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    proc, url = start_server(
        ["--api-key", API_KEY, "--served-model-name", MODEL,
         "--num-kv-blocks", str(ENGINE_KWARGS["num_kv_blocks"]),
         "--max-model-len", str(ENGINE_KWARGS["max_model_len"])], log_path)
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def llm(smollm2) -> LLM:
    return LLM(smollm2, **ENGINE_KWARGS)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, timeout=60, max_retries=0)


def greedy(llm: LLM, prompts: list[str], max_tokens: int) -> list:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def metrics(server: str) -> dict[str, float]:
    text = httpx.get(f"{server}/metrics", headers=AUTH, timeout=10).text
    values = {}
    for line in text.splitlines():
        match = re.match(r"^(pagedrt_\w+(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def wait_until_idle(server: str, timeout_s: float = 30) -> dict[str, float]:
    """Poll /metrics until no request runs or waits and no KV block is held."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(server)
        if (m["pagedrt_kv_blocks_used"] == 0 and m["pagedrt_num_requests_running"] == 0
                and m["pagedrt_num_requests_waiting"] == 0):
            return m
        assert time.monotonic() < deadline, f"server still busy after {timeout_s} s: {m}"
        time.sleep(0.1)


# ---------------------------------------------------------------- openai client
def test_models_and_health(server, client):
    import pagedrt

    assert httpx.get(f"{server}/health", timeout=10).status_code == 200
    assert [m.id for m in client.models.list().data] == [MODEL]
    # vLLM's /version, behind the key as every path but /health
    assert httpx.get(f"{server}/version", headers=AUTH, timeout=10).json() == {
        "version": pagedrt.__version__}
    assert httpx.get(f"{server}/version", timeout=10).status_code == 401


def test_completions_stream_equals_non_stream(client, llm):
    prompt = "The capital of France is"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    assert full.usage.prompt_tokens == len(llm.get_tokenizer().encode(prompt))
    assert full.usage.completion_tokens == 20 and full.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=20,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream_equals_non_stream_and_utf8_never_broken(client):
    messages = [{"role": "user", "content": "Say hello in Japanese."}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                          temperature=0)
    expected = full.choices[0].message.content
    assert full.choices[0].message.role == "assistant"
    assert any(ord(ch) > 0x7F for ch in expected)  # multi-byte characters, split across tokens
    assert full.usage.completion_tokens == 24
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                            temperature=0, stream=True)
    deltas = [c.choices[0].delta.content or "" for c in stream]
    assert "".join(deltas) == expected
    # Only the last delta may hold U+FFFD: the flush of a character cut by max_tokens.
    assert all("\ufffd" not in d for d in deltas[:-1]), deltas


def test_stop_string_spanning_tokens_never_streamed(client):
    prompt = "The history of the Roman Empire"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0,
                                    logprobs=0).choices[0]
    # Three tokens in the middle (" Emperor Trajan"); its first word is in the text earlier
    # too, so the stream must hold " Emperor" back and later release it.
    stop = "".join(out.logprobs.tokens[23:26])
    assert len(stop) >= 3 and stop in out.text, (stop, out.text)
    expected = out.text[: out.text.find(stop)]
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0,
                                     stop=[stop])
    assert full.choices[0].text == expected and full.choices[0].finish_reason == "stop"
    chunks = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop], stream=True)]
    assert "".join(chunks) == expected
    assert all(stop not in "".join(chunks[: i + 1]) for i in range(len(chunks)))


_EXTENSIONS = ("top_k", "min_p", "repetition_penalty")


def test_logprobs_n_and_mixed_sampling_params(client, server):
    """Greedy, top-k (also >= vocab), top-p, min-p, penalties and seeds in one batch."""
    prompt = "Once upon a time"
    variants = [
        {"temperature": 0},
        {"temperature": 0.8, "top_k": 5},
        {"temperature": 1.0, "top_k": 10**6},
        {"temperature": 0.7, "top_p": 0.5},
        {"temperature": 1.0, "min_p": 0.2},
        {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 7},
        {"temperature": 1.0, "presence_penalty": 1.0, "frequency_penalty": 0.5,
         "repetition_penalty": 1.3, "seed": 7},
        {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 7},
    ]

    async def run_all():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=API_KEY, timeout=60,
                                      max_retries=0) as aclient:
            calls = []
            for v in variants:  # vLLM's extensions go in extra_body
                kwargs = {k: x for k, x in v.items() if k not in _EXTENSIONS}
                extra = {k: x for k, x in v.items() if k in _EXTENSIONS}
                calls.append(aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                                        extra_body=extra, **kwargs))
            return await asyncio.wait_for(asyncio.gather(*calls), timeout=120)

    results = asyncio.run(run_all())
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in results)
    assert results[5].choices[0].text == results[7].choices[0].text  # same seed, same text

    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=1.0,
                                  n=2, logprobs=3, seed=1)
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
        # the 3 most likely, and the sampled token where it is not among them
        assert all(len(top) <= 4 and tok in top
                   for tok, top in zip(lp.tokens, lp.top_logprobs, strict=True))
        assert all(x <= 0 for x in lp.token_logprobs)
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    chat = client.chat.completions.create(model=MODEL, max_tokens=5, temperature=0,
                                          messages=[{"role": "user", "content": "Hi"}],
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.logprob - 1e-6
               for t in content)


def test_beam_search_streamed_or_not_matches_llm_beam_search(client, llm):
    """use_beam_search (vLLM's extension): n beams, best first, as LLM.beam_search finds them;
    a stream delivers them when the search ends."""
    prompt = "The capital of France is"
    (want,) = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=8))
    tok = llm.get_tokenizer()
    prompt_len = len(tok.encode(prompt))
    texts = [tok.decode(s.tokens[prompt_len:], skip_special_tokens=True) for s in want.sequences]
    extra = {"use_beam_search": True, "length_penalty": 1.0, "early_stopping": False}
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, n=3,
                                  extra_body=extra)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == texts
    assert r.usage.completion_tokens == sum(len(s.tokens) - prompt_len for s in want.sequences)
    streamed = ["", "", ""]
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, n=3,
                                           extra_body=extra, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == texts
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=6, n=2, messages=[{"role": "user", "content": "Hi"}],
        extra_body={"use_beam_search": True})
    assert len(chat.choices) == 2 and chat.choices[0].message.content


def test_32_concurrent_streaming_clients_match_llm_generate(server, llm):
    prompts = [f"Fact number {i} about the number {i * 7}:" for i in range(32)]
    expected = [o.text for o in greedy(llm, prompts, 12)]

    async def one(aclient, prompt):
        stream = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                                  temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def run_all():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=API_KEY, timeout=120,
                                      max_retries=0) as aclient:
            return await asyncio.wait_for(
                asyncio.gather(*(one(aclient, p) for p in prompts)), timeout=180)

    texts = asyncio.run(run_all())
    assert texts == expected
    wait_until_idle(server)


# ---------------------------------------------------------------- disconnects
def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    before = metrics(server)
    body = {"model": MODEL, "prompt": "Tell me everything about the ocean.", "max_tokens": 1000,
            "temperature": 1.0, "ignore_eos": True, "n": 2, "stream": True}
    with (httpx.Client(timeout=60) as http,
          http.stream("POST", f"{server}/v1/completions", json=body, headers=AUTH) as resp):
        assert resp.status_code == 200
        num_events = 0
        for line in resp.iter_lines():
            num_events += line.startswith("data: ")
            if num_events >= 4:
                break  # leaving the with-block closes the connection mid-stream
    m = wait_until_idle(server)
    assert m['pagedrt_request_success_total{finished_reason="abort"}'] == (
        before.get('pagedrt_request_success_total{finished_reason="abort"}', 0) + 2)
    generated = m["pagedrt_generation_tokens_total"] - before["pagedrt_generation_tokens_total"]
    assert generated < 2 * 200, generated  # stopped long before max_tokens


def test_disconnect_while_waiting_for_non_streamed_response(server):
    before = metrics(server)
    body = {"model": MODEL, "prompt": "Tell me about mountains.", "max_tokens": 1000,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/completions", json=body, headers=AUTH, timeout=1.5)
    m = wait_until_idle(server)
    generated = m["pagedrt_generation_tokens_total"] - before["pagedrt_generation_tokens_total"]
    assert generated < 200, generated


# ---------------------------------------------------------------- bad input
_LONG_PROMPT_IDS = [1] * 2049
BAD_REQUESTS = [
    # (name, path, body (bytes: sent raw), headers, status, param)
    ("malformed json", "/v1/completions", b'{"prompt": "hi", ', AUTH, 400, None),
    ("body not an object", "/v1/completions", b"[1, 2]", AUTH, 400, None),
    ("missing prompt", "/v1/completions", {"max_tokens": 4}, AUTH, 400, "prompt"),
    ("empty prompt", "/v1/completions", {"prompt": ""}, AUTH, 400, "prompt"),
    ("empty prompt list", "/v1/completions", {"prompt": []}, AUTH, 400, "prompt"),
    ("empty messages", "/v1/chat/completions", {"messages": []}, AUTH, 400, "messages"),
    ("prompt > max_model_len", "/v1/completions", {"prompt": _LONG_PROMPT_IDS}, AUTH, 400,
     "prompt"),
    ("prompt + max_tokens > max_model_len", "/v1/completions",
     {"prompt": "Hello there", "max_tokens": 2047}, AUTH, 400, "prompt"),
    ("chat prompt + max_tokens > max_model_len", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2040}, AUTH, 400,
     "messages"),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}, AUTH, 400,
     "max_tokens"),
    ("n 0", "/v1/completions", {"prompt": "hi", "n": 0}, AUTH, 400, "n"),
    ("n too large", "/v1/completions", {"prompt": "hi", "n": 10**6}, AUTH, 400, "n"),
    ("seed beyond 64 bits", "/v1/completions", {"prompt": "hi", "seed": 2**64}, AUTH, 400,
     "seed"),
    ("temperature < 0", "/v1/completions", {"prompt": "hi", "temperature": -0.5}, AUTH, 400,
     "temperature"),
    ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}, AUTH, 400, "top_p"),
    ("top_p > 1", "/v1/completions", {"prompt": "hi", "top_p": 1.5}, AUTH, 400, "top_p"),
    ("top_k -2", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "top_k": -2}, AUTH, 400, "top_k"),
    ("top_k beyond 64 bits", "/v1/completions", {"prompt": "hi", "top_k": 2**63}, AUTH, 400,
     "top_k"),
    ("stop_token_ids beyond 64 bits", "/v1/completions",
     {"prompt": "hi", "stop_token_ids": [2**70]}, AUTH, 400, "stop_token_ids"),
    ("unknown model", "/v1/completions", {"prompt": "hi", "model": "gpt-4"}, AUTH, 404, "model"),
    ("temperature a string", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, AUTH,
     400, "temperature"),
    ("max_tokens a numeric string", "/v1/completions", {"prompt": "hi", "max_tokens": "5"},
     AUTH, 400, "max_tokens"),
    ("n a bool", "/v1/completions", {"prompt": "hi", "n": True}, AUTH, 400, "n"),
    ("stop a number", "/v1/completions", {"prompt": "hi", "stop": 5}, AUTH, 400, "stop"),
    ("messages a string", "/v1/chat/completions", {"messages": "hi"}, AUTH, 400, "messages"),
    ("message without role", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, AUTH,
     400, "messages"),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]},
     AUTH, 400, "messages"),
    ("user content null", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": None}]}, AUTH, 400, "messages"),
    ("content a number", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     AUTH, 400, "messages"),
    ("stream_options without stream", "/v1/completions",
     {"prompt": "hi", "stream_options": {"include_usage": True}}, AUTH, 400, "stream_options"),
    ("chat stream_options with stream false", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "stream": False,
      "stream_options": {"include_usage": True}}, AUTH, 400, "stream_options"),
    ("max_completion_tokens -1", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}, AUTH, 400,
     "max_completion_tokens"),
    ("top_logprobs 30", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 30},
     AUTH, 400, "top_logprobs"),
    ("token id out of vocab", "/v1/completions", {"prompt": [10**9]}, AUTH, 400, "prompt"),
    ("bad params when streaming", "/v1/completions",
     {"prompt": "hi", "stream": True, "top_p": 2}, AUTH, 400, "top_p"),
    ("beam search with top_p", "/v1/completions",
     {"prompt": "hi", "use_beam_search": True, "top_p": 0.5}, AUTH, 400, "top_p"),
    ("beam search with temperature", "/v1/completions",
     {"prompt": "hi", "use_beam_search": True, "temperature": 0.7}, AUTH, 400, "temperature"),
    ("beam search with logprobs", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "use_beam_search": True,
      "logprobs": True}, AUTH, 400, "top_logprobs"),
    ("beam width beyond max_num_seqs", "/v1/completions",
     {"prompt": "hi", "use_beam_search": True, "n": 300}, AUTH, 400, "n"),
    ("length_penalty without beam search", "/v1/completions",
     {"prompt": "hi", "length_penalty": 2.0}, AUTH, 400, "length_penalty"),
    ("early_stopping a number", "/v1/completions",
     {"prompt": "hi", "use_beam_search": True, "early_stopping": 3}, AUTH, 400,
     "early_stopping"),
    ("missing api key", "/v1/completions", {"prompt": "hi"}, {}, 401, None),
    ("wrong api key", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]},
     {"Authorization": "Bearer nope"}, 401, None),
    ("models without key", "/v1/models", None, {}, 401, None),
    ("metrics without key", "/metrics", None, {}, 401, None),
    ("openapi.json without key", "/openapi.json", None, {}, 401, None),
    ("temperature NaN", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', AUTH, 400,
     "temperature"),
    ("temperature Infinity", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', AUTH, 400,
     "temperature"),
    ("repetition_penalty 1e400", "/v1/completions",
     b'{"prompt": "hi", "repetition_penalty": 1e400}', AUTH, 400, "repetition_penalty"),
    ("top_p -Infinity", "/v1/completions", b'{"prompt": "hi", "top_p": -Infinity}', AUTH, 400,
     "top_p"),
    ("too many prompts", "/v1/completions", {"prompt": ["hi"] * 300}, AUTH, 400, "prompt"),
    ("prompt text far beyond max_model_len", "/v1/completions", {"prompt": "a " * 200_000},
     AUTH, 400, "prompt"),
    ("1 MB model name", "/v1/completions", {"prompt": "hi", "model": "m" * 2**20}, AUTH, 404,
     "model"),
]


def test_bad_input_gets_4xx_openai_error_and_server_keeps_serving(server):
    with httpx.Client(base_url=server, timeout=30) as http:
        for name, path, body, headers, status, param in BAD_REQUESTS:
            if body is None:
                resp = http.get(path, headers=headers)
            else:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                resp = http.post(path, content=content,
                                 headers={**headers, "Content-Type": "application/json"})
            assert resp.status_code == status, (name, resp.status_code, resp.text)
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, (name, error)
            assert error["message"] and error["param"] == param, (name, error)
            expected_type = "authentication_error" if status == 401 else "invalid_request_error"
            assert error["type"] == expected_type, (name, error)
            assert http.get("/health").status_code == 200, name
    wait_until_idle(server)


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi")
    bad_key = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


def test_chat_length_errors_name_max_completion_tokens_when_sent(server):
    """A chat whose prompt + max_completion_tokens exceeds max_model_len: the 400 names the
    field the client sent, not the Python API's max_tokens."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2040}
    resp = httpx.post(f"{server}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "max_completion_tokens (2040)" in error["message"], error
    assert "max_tokens" not in error["message"].replace("max_completion_tokens", ""), error
    # sent as max_tokens, it is named so
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2040}
    error = httpx.post(f"{server}/v1/chat/completions", json=body, headers=AUTH,
                       timeout=30).json()["error"]
    assert "max_tokens (2040)" in error["message"], error


# ---------------------------------------------------------------- metrics
def test_metrics_exposes_the_series(server):
    # one request of its own: the token counters must not rely on the tests before it (run
    # alone, or with the file's tests spread over workers, they saw none)
    httpx.post(f"{server}/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
               headers=AUTH, timeout=60).raise_for_status()
    text = httpx.get(f"{server}/metrics", headers=AUTH, timeout=10).text
    for name in ("pagedrt_num_requests_running", "pagedrt_num_requests_waiting",
                 "pagedrt_kv_blocks_used", "pagedrt_kv_blocks_free", "pagedrt_kv_blocks_cached",
                 "pagedrt_kv_blocks_total", "pagedrt_prefix_cache_hit_rate",
                 "pagedrt_num_preemptions_total", "pagedrt_prompt_tokens_total",
                 "pagedrt_generation_tokens_total",
                 "pagedrt_time_to_first_token_seconds_bucket",
                 "pagedrt_inter_token_latency_seconds_bucket",
                 "pagedrt_e2e_request_latency_seconds_count"):
        assert re.search(rf"^{name}(\{{[^}}]*\}})? ", text, re.MULTILINE), name
    m = metrics(server)
    assert m["pagedrt_kv_blocks_total"] == ENGINE_KWARGS["num_kv_blocks"]
    # every series the server exports is in the README's table (as a sample is named:
    # a counter with _total), and the table names none it does not export; prometheus_client's
    # own _created gauges (a histogram's creation time) aside
    exported = set()
    for name, kind in re.findall(r"^# TYPE (pagedrt_\w+) (\w+)$", text, re.MULTILINE):
        if name.endswith("_created"):
            continue
        exported.add(f"{name}_total" if kind == "counter" and not name.endswith("_total")
                     else name)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("### Metrics", 1)[1].split("\n\n`used` blocks", 1)[0]
    documented = {re.sub(r"\{.*", "", name) for name in re.findall(r"`(pagedrt_[^`]+)`", table)}
    assert exported == documented, (exported - documented, documented - exported)
    assert m["pagedrt_prompt_tokens_total"] > 0 and m["pagedrt_generation_tokens_total"] > 0
    assert m["pagedrt_time_to_first_token_seconds_count"] > 0
