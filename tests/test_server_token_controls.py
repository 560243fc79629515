"""logit_bias, allowed_token_ids, bad_words, refused fields, /tokenize and /detokenize through
a real `pagedrt serve` process on 127.0.0.1 (SmolLM2, CPU). Expected tokens come from
`LLM.generate` in this process with the same settings; every wait is bounded."""

from __future__ import annotations

import httpx
import pytest
import test_server
from test_server import AUTH, ENGINE_KWARGS, MODEL, wait_until_idle

from pagedrt import LLM, SamplingParams

# test_server's fixtures (pytest gives this module a server of its own)
server, llm, client = test_server.server, test_server.llm, test_server.client


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, headers=AUTH, timeout=60) as h:
        yield h


def _tokens(llm: LLM, prompt, params: SamplingParams) -> list[int]:
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids


def test_logit_bias_changes_the_completion_as_in_llm_generate(client, llm):
    """A ban (-100, OpenAI's string key) on the greedy text's first token: the server's text
    is LLM.generate's with the same bias, and differs from the unbiased one; seeded sampling
    with a bias and allowed ids equals LLM.generate's too."""
    prompt = "The capital of France is"
    tok = llm.get_tokenizer()
    plain = _tokens(llm, prompt, SamplingParams(temperature=0, max_tokens=8))
    bias = {plain[0]: -100}
    expected = _tokens(llm, prompt, SamplingParams(temperature=0, max_tokens=8, logit_bias=bias))
    assert expected[0] != plain[0]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                  logit_bias={str(plain[0]): -100})
    assert r.choices[0].text == tok.decode(expected, skip_special_tokens=True)
    allowed = sorted({*plain, *expected, 11, 12, 13})
    params = SamplingParams(temperature=1.0, seed=4, max_tokens=10, logit_bias={13: 3.0},
                            allowed_token_ids=allowed)
    expected = _tokens(llm, prompt, params)
    assert set(expected) <= set(allowed)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=1.0,
                                  seed=4, logit_bias={"13": 3.0},
                                  extra_body={"allowed_token_ids": allowed})
    assert r.choices[0].text == tok.decode(expected, skip_special_tokens=True)


def test_chat_takes_them_and_tokenize_gives_the_chat_prompt(client, http, llm):
    """The chat endpoint with allowed_token_ids: LLM.generate's tokens over the prompt that
    /tokenize gives for the same messages (whose count is the chat's prompt_tokens)."""
    messages = [{"role": "user", "content": "Name a colour."}]
    t = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
    allowed = llm.get_tokenizer().encode(" red green blue yellow and, or.")
    params = SamplingParams(temperature=0, max_tokens=12, allowed_token_ids=allowed)
    expected = _tokens(llm, t["tokens"], params)
    assert set(expected) <= set(allowed)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                       temperature=0, extra_body={"allowed_token_ids": allowed})
    assert r.usage.prompt_tokens == t["count"]
    text = llm.get_tokenizer().decode(expected, skip_special_tokens=True)
    assert r.choices[0].message.content == text


def test_bad_words_change_the_completion_and_the_chat_as_in_llm_generate(client, http, llm):
    """vLLM's bad_words on both endpoints (tokenized by the API process, banned by the engine
    core): a one-token word (the greedy completion's first) and a two-word phrase of the
    greedy chat answer; each answer is LLM.generate's with the same words, and differs from
    the answer without them."""
    tok = llm.get_tokenizer()
    prompt = "The capital of France is"
    plain = _tokens(llm, prompt, SamplingParams(temperature=0, max_tokens=8))
    word = tok.decode([plain[0]]).strip()
    expected = _tokens(llm, prompt, SamplingParams(temperature=0, max_tokens=8,
                                                   bad_words=[word]))
    assert expected[0] != plain[0] and plain[0] not in expected
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"bad_words": [word]})
    assert r.choices[0].text == tok.decode(expected, skip_special_tokens=True)
    messages = [{"role": "user", "content": "Name a colour."}]
    ids = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()["tokens"]
    plain = _tokens(llm, ids, SamplingParams(temperature=0, max_tokens=12))
    phrase = tok.decode(plain[3:5])  # two words of the answer: the second after the first
    expected = _tokens(llm, ids, SamplingParams(temperature=0, max_tokens=12,
                                                bad_words=[phrase]))
    assert expected[:4] == plain[:4] and expected[4] != plain[4], (phrase, plain, expected)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                       temperature=0, extra_body={"bad_words": [phrase]})
    assert r.choices[0].message.content == tok.decode(expected, skip_special_tokens=True)


def test_tokenize_round_trips_with_detokenize(http, llm):
    tok = llm.get_tokenizer()
    prompt = "Paris is the capital of France, and Lyon is \u00e9l\u00e9gant."
    t = http.post("/tokenize", json={"prompt": prompt}).json()
    assert t == {"tokens": tok.encode(prompt), "count": len(tok.encode(prompt)),
                 "max_model_len": ENGINE_KWARGS["max_model_len"]}
    no_special = http.post("/tokenize", json={"prompt": prompt, "add_special_tokens": False})
    assert no_special.json()["tokens"] == tok.encode(prompt, add_special_tokens=False)
    d = http.post("/detokenize", json={"model": MODEL, "tokens": t["tokens"]})
    assert d.status_code == 200 and d.json() == {"prompt": prompt}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for add in (True, False):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
        got = http.post("/tokenize", json={"messages": messages,
                                           "add_generation_prompt": add}).json()
        assert got["tokens"] == tok.encode(text)
        back = http.post("/detokenize", json={"tokens": got["tokens"]}).json()["prompt"]
        assert back == text  # special tokens kept
    with_prompt = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    without = http.post("/tokenize", json={"messages": messages,
                                           "add_generation_prompt": False}).json()["tokens"]
    assert len(with_prompt) > len(without)  # the default adds the assistant's header
    empty = http.post("/tokenize", json={"prompt": ""})  # (vLLM's answer: no tokens)
    assert empty.status_code == 200 and empty.json()["tokens"] == tok.encode("")
    none = http.post("/detokenize", json={"tokens": []})
    assert none.status_code == 200 and none.json() == {"prompt": ""}
    strs = http.post("/tokenize", json={"prompt": prompt, "return_token_strs": True}).json()
    assert strs["tokens"] == t["tokens"]
    assert strs["token_strs"] == tok.convert_ids_to_tokens(t["tokens"])


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"model": "no-such-model", "prompt": "hi"}, 404, "model"),
    ("/detokenize", {"model": "no-such-model", "tokens": [1]}, 404, "model"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {}, 400, "messages"),
    ("/tokenize", {"prompt": "hi", "add_generation_prompt": True}, 400, "add_generation_prompt"),
    ("/detokenize", {"tokens": [1, 49152]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": ["1"]}, 400, "tokens"),
])
def test_tokenize_errors(http, path, body, status, param):
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"], error


BAD = [
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, "logit_bias", "abc"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"-3": 1}}, "logit_bias", "-3"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"49152": 1}}, "logit_bias",
     "not in the vocabulary [0, 49152)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "logit_bias": {"5": -100.5}}, "logit_bias", "[-100, 100]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "logit_bias": {"5": "x"}}, "logit_bias", "valid number"),
    ("/v1/completions", {"prompt": "hi", "allowed_token_ids": []}, "allowed_token_ids",
     "at least one"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "allowed_token_ids": [1, 60000]}, "allowed_token_ids",
     "allowed_token_ids[1]=60000"),
    ("/v1/completions", {"prompt": "hi", "n": 2, "use_beam_search": True,
                         "logit_bias": {"5": 1}}, "logit_bias", "beam search"),
    ("/v1/completions", {"prompt": "hi", "bad_words": ["ok", " "]}, "bad_words",
     "bad_words[1]=' ' gives no token"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "bad_words": [""]}, "bad_words", "non-empty string"),
    ("/v1/completions", {"prompt": "hi", "bad_words": "hi"}, "bad_words", "valid array"),
    ("/v1/completions", {"prompt": "hi", "n": 2, "use_beam_search": True,
                         "bad_words": ["x"]}, "bad_words", "beam search"),
    # fields not built, one of each kind, on both endpoints
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_object"}}, "response_format",
     "not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools", "not supported"),
    ("/v1/completions", {"prompt": "hi", "guided_regex": "[0-9]+"}, "guided_regex",
     "not supported"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, "best_of", "not supported"),
]


def test_bad_values_and_unsupported_fields_get_400_and_hold_no_block(server, http):
    for path, body, param, part in BAD:
        r = http.post(path, json={**body, "max_tokens": 4})
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and part in error["message"], (body, error)
        assert error["type"] == "invalid_request_error"
    assert http.get("/health").status_code == 200
    m = wait_until_idle(server)
    assert m["pagedrt_kv_blocks_used"] == 0


def test_harmless_fields_are_accepted(http):
    body = {"prompt": "hi", "max_tokens": 2, "user": "u", "metadata": {"a": "b"},
            "store": False, "service_tier": "auto", "parallel_tool_calls": False,
            "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
            "best_of": 1}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


def test_a_stop_tokens_text_is_left_out_as_in_vllm(client, llm):
    """A completion stopped by one of stop_token_ids ends before that token's text (vLLM's
    detokenizer leaves a stop token's text out unless include_stop_str_in_output), streamed
    or not, with the id as stop_reason; include_stop_str_in_output keeps it; LLM.generate
    gives the same texts."""
    prompt = "The capital of France is"
    tok = llm.get_tokenizer()
    plain = _tokens(llm, prompt, SamplingParams(temperature=0, max_tokens=8))
    stop = plain[2]
    assert stop not in plain[:2], plain
    before = tok.decode(plain[:2], skip_special_tokens=True)
    with_stop = tok.decode(plain[:3], skip_special_tokens=True)
    assert before != with_stop
    for include in (False, True):
        want = with_stop if include else before
        extra = {"stop_token_ids": [stop], "include_stop_str_in_output": include}
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body=extra)
        choice = r.choices[0]
        assert (choice.text, choice.finish_reason, choice.stop_reason) == (want, "stop", stop)
        chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                           temperature=0, stream=True, extra_body=extra)
        assert "".join(c.choices[0].text for c in chunks) == want
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8,
                                                    stop_token_ids=[stop],
                                                    include_stop_str_in_output=include),
                           use_tqdm=False)[0].outputs[0]
        assert out.text == want and list(out.token_ids) == plain[:3]
