"""`echo` and `prompt_logprobs` on the OpenAI-compatible server, end to end: a real `pagedrt
serve` process (its engine core in its own process) on 127.0.0.1, raw httpx clients. The prompt
tokens' logprobs are checked against HF transformers run over the whole prompt on the same
weights; every wait is bounded."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import torch
from server_process import start_server, stop_server

API_KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The capital of France is Paris, and the capital of Italy is"
# two requests' logprobs of the same tokens, server against server: their prompts may be
# computed in batches of other shapes (a request's prompts reach the engine one by one and may
# share a step or not, and so may other requests'), so fp32 sums run in another order, about
# 1e-6 of the value apart (1.7e-5 at -11.54 in a CI run on 2026-12-07): relative, or 1e-5 near 0
SAME = {"rel": 1e-5, "abs": 1e-5}


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory) -> str:
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    proc, url = start_server(["--api-key", API_KEY, "--served-model-name", MODEL,
                              "--num-kv-blocks", "128", "--max-model-len", "1024"], log_path)
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def reference(smollm2, hf_smollm2) -> tuple[list[int], torch.Tensor]:
    """The prompt's token ids and HF's log_softmax at every position ([P, vocab])."""
    ids = smollm2.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        logits = hf_smollm2(input_ids=torch.tensor([ids])).logits[0]
    return ids, torch.log_softmax(logits.float(), dim=-1)


def post(server: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server}/v1/{path}", json={"model": MODEL, **body}, headers=AUTH,
                      timeout=120)


def stream_chunks(server: str, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{server}/v1/completions", headers=AUTH, timeout=120,
                      json={"model": MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def token_logprob(ref: torch.Tensor, ids: list[int], j: int) -> float:
    return ref[j - 1, ids[j]].item()


def rank(ref: torch.Tensor, ids: list[int], j: int) -> int:
    """1 + how many tokens HF finds likelier than prompt token j at its position."""
    return 1 + int((ref[j - 1] > ref[j - 1, ids[j]]).sum())


def assert_idle(server: str) -> None:
    """No KV block held and nothing running (every request's blocks were freed)."""
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(f"{server}/metrics", headers=AUTH, timeout=10).text
        values = dict(line.rsplit(" ", 1) for line in text.splitlines()
                      if line.startswith(("pagedrt_kv_blocks_used ",
                                          "pagedrt_num_requests_running ")))
        if all(float(v) == 0 for v in values.values()) and len(values) == 2:
            return
        assert time.monotonic() < deadline, values
        time.sleep(0.1)


def test_echo_with_logprobs_covers_the_prompt(server, reference):
    ids, ref = reference
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2, "echo": True}
    r = post(server, "completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    plain = post(server, "completions", {**body, "echo": False}).json()["choices"][0]
    assert choice["text"] == PROMPT + plain["text"]
    lp = choice["logprobs"]
    p = len(ids)
    assert len(lp["tokens"]) == p + len(plain["logprobs"]["tokens"])
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for j in range(1, p):
        assert lp["token_logprobs"][j] == pytest.approx(token_logprob(ref, ids, j), abs=2e-3)
        top = lp["top_logprobs"][j]
        assert len(top) == (2 if rank(ref, ids, j) <= 2 else 3)  # + the prompt token
        assert top[lp["tokens"][j]] == lp["token_logprobs"][j]
        best = ref[j - 1].max().item()
        assert max(top.values()) == pytest.approx(best, abs=2e-3)
    assert lp["token_logprobs"][p:] == pytest.approx(plain["logprobs"]["token_logprobs"],
                                                     **SAME)
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[p] == sum(len(t) for t in lp["tokens"][:p])
    assert "prompt_logprobs" not in choice  # (not asked)


def test_streamed_echo_gives_the_same_text_and_logprobs(server, reference):
    ids, _ = reference
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1, "echo": True,
            "n": 2}
    whole = post(server, "completions", body).json()["choices"]
    chunks = [c for c in stream_chunks(server, body) if c["choices"]]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["text"].startswith(PROMPT)  # the first chunk leads with the prompt
        assert "".join(c["text"] for c in mine) == whole[index]["text"]
        tokens = [t for c in mine if c["logprobs"] for t in c["logprobs"]["tokens"]]
        values = [v for c in mine if c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
        assert tokens == whole[index]["logprobs"]["tokens"]
        assert values[0] is None
        assert values[1:] == pytest.approx(whole[index]["logprobs"]["token_logprobs"][1:],
                                           **SAME)
        assert len(tokens) > len(ids)
        tops = [t for c in mine if c["logprobs"] for t in c["logprobs"]["top_logprobs"]]
        assert_same_tops(tops, whole[index]["logprobs"]["top_logprobs"])


def assert_same_tops(tops: list, expected: list) -> None:
    """The same top_logprobs (keys in the same order, values within SAME)."""
    assert [None if t is None else list(t) for t in tops] == [
        None if t is None else list(t) for t in expected]
    for t, e in zip(tops, expected, strict=True):
        if t is not None:
            assert list(t.values()) == pytest.approx(list(e.values()), **SAME)


def streamed_logprobs(chunks: list[dict], index: int = 0) -> dict:
    """One choice's logprobs objects of a stream, joined."""
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for choice in c["choices"]:
            if choice["index"] == index and choice["logprobs"]:
                for key, values in joined.items():
                    values.extend(choice["logprobs"][key])
    return joined


def test_top_logprobs_hold_the_sampled_token(server):
    """As OpenAI's legacy completions: logprobs=0 gives {token: its logprob} per position; a
    token sampled outside the top k (temperature 2, seeded) is there besides the k; one inside
    adds nothing. Streamed and whole responses give the same objects."""
    r = post(server, "completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                     "logprobs": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == r.json()["usage"]["completion_tokens"] > 0
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"],
                                                         strict=True)]
    greedy = post(server, "completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                          "logprobs": 2}).json()["choices"][0]["logprobs"]
    for tok, value, top in zip(greedy["tokens"], greedy["token_logprobs"],
                               greedy["top_logprobs"], strict=True):
        assert len(top) == 2 and top[tok] == value == max(top.values())

    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 2.0, "seed": 11, "logprobs": 1,
            "ignore_eos": True}
    lp = post(server, "completions", body).json()["choices"][0]["logprobs"]
    outside = 0
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                               strict=True):
        assert top[tok] == value
        if len(top) == 2:  # sampled outside the top 1: the likelier one first
            outside += 1
            assert list(top)[-1] == tok and next(iter(top.values())) >= value
        else:
            assert len(top) == 1
    assert outside >= 3, lp  # (the seed makes this hold every run)
    streamed = streamed_logprobs(stream_chunks(server, body))
    assert streamed["tokens"] == lp["tokens"]
    assert_same_tops(streamed["top_logprobs"], lp["top_logprobs"])


def test_streamed_echo_without_logprobs(server):
    chunks = [c for c in stream_chunks(server, {"prompt": [PROMPT, "Hello"], "max_tokens": 3,
                                                "temperature": 0, "echo": True})
              if c["choices"]]
    texts = {0: "", 1: ""}
    for c in chunks:
        texts[c["choices"][0]["index"]] += c["choices"][0]["text"]
    assert texts[0].startswith(PROMPT) and texts[1].startswith("Hello")
    assert len(texts[0]) > len(PROMPT)


def test_prompt_logprobs_field_on_completions(server, reference):
    ids, ref = reference
    r = post(server, "completions", {"prompt": ids, "max_tokens": 2, "temperature": 0,
                                     "prompt_logprobs": 3})
    assert r.status_code == 200, r.text
    response = r.json()
    entries = response["choices"][0]["prompt_logprobs"]
    assert response["prompt_logprobs"] == entries
    assert len(entries) == len(ids) and entries[0] is None
    for j in range(1, len(ids)):
        item = entries[j]
        assert str(ids[j]) in item and 1 <= len(item) <= 4
        mine = item[str(ids[j])]
        assert mine["logprob"] == pytest.approx(token_logprob(ref, ids, j), abs=2e-3)
        assert mine["rank"] >= 1 and isinstance(mine["decoded_token"], str)
        assert all(1 <= v["rank"] <= 3 for k, v in item.items() if k != str(ids[j]))


def test_prompt_logprobs_field_on_chat(server):
    r = post(server, "chat/completions", {"messages": [{"role": "user", "content": "Hi!"}],
                                          "max_tokens": 2, "temperature": 0,
                                          "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    response = r.json()
    entries = response["prompt_logprobs"]
    assert len(entries) == response["usage"]["prompt_tokens"] and entries[0] is None
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in entries[1:])


def hf_log_softmax(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = hf_model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def assert_scores(lp: dict, ids: list[int], ref: torch.Tensor, num_top: int) -> None:
    """A legacy logprobs object covering exactly the prompt `ids`, values as HF's."""
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][0] == 0
    for j in range(1, len(ids)):
        value = lp["token_logprobs"][j]
        assert value == pytest.approx(token_logprob(ref, ids, j), abs=2e-3)
        top = lp["top_logprobs"][j]
        assert top[lp["tokens"][j]] == value  # the prompt token, whatever its rank
        assert num_top <= len(top) <= num_top + 1


def test_echo_only_scores_the_prompt(server, reference):
    """echo=true, max_tokens=0: the prompt alone, its tokens' logprobs (HF's values), finish
    "length", no completion token; streamed the same, in one chunk."""
    ids, ref = reference
    body = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1}
    r = post(server, "completions", body)
    assert r.status_code == 200, r.text
    response = r.json()
    [choice] = response["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert choice["stop_reason"] is None
    assert_scores(choice["logprobs"], ids, ref, 1)
    assert response["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0,
                                 "total_tokens": len(ids)}
    # a prompt token of rank > 1 is there besides the most likely one
    assert any(rank(ref, ids, j) > 1 and len(choice["logprobs"]["top_logprobs"][j]) == 2
               for j in range(1, len(ids)))

    chunks = stream_chunks(server, {**body, "stream_options": {"include_usage": True}})
    mine = [c["choices"][0] for c in chunks if c["choices"]]
    assert len(mine) == 1 and mine[0]["text"] == PROMPT
    assert mine[0]["finish_reason"] == "length" and mine[0]["stop_reason"] is None
    streamed = mine[0]["logprobs"]
    assert streamed["tokens"] == choice["logprobs"]["tokens"]
    assert streamed["text_offset"] == choice["logprobs"]["text_offset"]
    assert streamed["token_logprobs"][0] is None
    assert streamed["token_logprobs"][1:] == pytest.approx(
        choice["logprobs"]["token_logprobs"][1:], **SAME)
    assert_same_tops(streamed["top_logprobs"], choice["logprobs"]["top_logprobs"])
    assert chunks[-1]["usage"] == response["usage"]
    assert_idle(server)


def test_echo_only_batch_token_ids_and_n(server, smollm2, hf_smollm2, reference):
    """A batch of token-id prompts with n=2: each choice its prompt's decoded text and scores,
    the n choices equal; a batch of texts without logprobs; streamed the same."""
    ids, ref = reference
    other = smollm2.tokenizer.encode("Water boils at one hundred degrees")
    refs = [ref, hf_log_softmax(hf_smollm2, other)]
    body = {"prompt": [ids, other], "max_tokens": 0, "echo": True, "logprobs": 0, "n": 2,
            "temperature": 1.0}
    r = post(server, "completions", body)
    assert r.status_code == 200, r.text
    response = r.json()
    choices = response["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for i, c in enumerate(choices):
        prompt_ids = [ids, other][i // 2]
        assert c["text"] == smollm2.tokenizer.decode(prompt_ids)
        assert c["finish_reason"] == "length"
        assert_scores(c["logprobs"], prompt_ids, refs[i // 2], 0)
    assert choices[0]["logprobs"] == choices[1]["logprobs"]
    assert choices[2]["logprobs"] == choices[3]["logprobs"]
    assert response["usage"]["prompt_tokens"] == len(ids) + len(other)  # (once per prompt)
    assert response["usage"]["completion_tokens"] == 0

    chunks = stream_chunks(server, body)
    for i, c in enumerate(choices):
        mine = [x["choices"][0] for x in chunks if x["choices"][0]["index"] == i]
        assert "".join(x["text"] for x in mine) == c["text"]
        assert [x["finish_reason"] for x in mine][-1] == "length"
        assert streamed_logprobs(chunks, i)["tokens"] == c["logprobs"]["tokens"]
        assert_same_tops(streamed_logprobs(chunks, i)["top_logprobs"],
                         c["logprobs"]["top_logprobs"])

    texts = ["Hello there", PROMPT]
    plain = post(server, "completions", {"prompt": texts, "max_tokens": 0, "echo": True})
    assert plain.status_code == 200, plain.text
    assert [(c["text"], c["logprobs"], c["finish_reason"]) for c in plain.json()["choices"]] == [
        (t, None, "length") for t in texts]
    assert plain.json()["usage"]["completion_tokens"] == 0
    chunks = stream_chunks(server, {"prompt": texts, "max_tokens": 0, "echo": True})
    assert sorted((c["choices"][0]["index"], c["choices"][0]["text"],
                   c["choices"][0]["finish_reason"]) for c in chunks) == [
        (0, texts[0], "length"), (1, texts[1], "length")]
    assert_idle(server)


def test_echo_only_leaves_out_a_token_that_stops(server, smollm2):
    """The one token the engine makes is left out even where it is a stop token or a stop
    string: finish "length", no stop_reason, no text after the prompt."""
    token = smollm2.tokenizer.encode(" Rome")[-1]
    word = smollm2.tokenizer.decode([token])
    for extra in ({"stop_token_ids": [token]}, {"stop": [word]}):
        for stream in (False, True):
            body = {"prompt": PROMPT, "max_tokens": 0, "echo": True,
                    "allowed_token_ids": [token], **extra}
            if stream:
                [chunk] = [c["choices"][0] for c in stream_chunks(server, body)]
                assert chunk["text"] == PROMPT, extra
                assert (chunk["finish_reason"], chunk["stop_reason"]) == ("length", None)
            else:
                r = post(server, "completions", body)
                assert r.status_code == 200, r.text
                c = r.json()["choices"][0]
                assert (c["text"], c["finish_reason"], c["stop_reason"]) == (
                    PROMPT, "length", None), extra
                assert r.json()["usage"]["completion_tokens"] == 0
        # (the same request generating one token does stop on it)
        r = post(server, "completions", {"prompt": PROMPT, "max_tokens": 1,
                                         "allowed_token_ids": [token], **extra})
        assert r.json()["choices"][0]["finish_reason"] == "stop", r.text
    assert_idle(server)


def test_echo_only_prompt_length(server, reference):
    """An echo-only prompt may have max_model_len - 1 tokens (the step makes one), not more."""
    ids, _ = reference
    long = (ids * 200)[:1023]
    r = post(server, "completions", {"prompt": long, "max_tokens": 0, "echo": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": 1023, "completion_tokens": 0,
                                 "total_tokens": 1023}
    r = post(server, "completions", {"prompt": long + ids[:1], "max_tokens": 0, "echo": True})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert "max_model_len - 1 = 1023" in error["message"]
    assert_idle(server)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": "Hi", "max_tokens": 0, "echo": False, "stream": True},
     "max_tokens"),
    ("completions", {"prompt": "Hi", "max_tokens": 0, "echo": True, "min_tokens": 2},
     "min_tokens"),
    ("completions", {"prompt": "Hi", "max_tokens": 0, "echo": True, "use_beam_search": True,
                     "n": 2}, "use_beam_search"),
    ("completions", {"prompt": "Hi", "max_tokens": -1, "echo": True}, "max_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0},
     "max_tokens"),
])
def test_max_tokens_0_without_echo_is_400(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    if param == "max_tokens" and path == "completions" and body["max_tokens"] == 0:
        assert "echo=true" in error["message"]
    assert_idle(server)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("completions", {"prompt": "Hi", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("completions", {"prompt": "Hi", "prompt_logprobs": -1}, "prompt_logprobs"),
    ("completions", {"prompt": "Hi", "prompt_logprobs": "2"}, "prompt_logprobs"),
    ("completions", {"prompt": "Hi", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("completions", {"prompt": "Hi", "prompt_logprobs": 1, "use_beam_search": True, "n": 2},
     "prompt_logprobs"),
    ("completions", {"prompt": "Hi", "echo": True, "suffix": "!"}, "suffix"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                          "prompt_logprobs": 25}, "prompt_logprobs"),
])
def test_bad_values_are_400_and_hold_nothing(server, path, body, param):
    r = post(server, path, {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert_idle(server)
