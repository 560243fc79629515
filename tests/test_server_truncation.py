"""vLLM's truncate_prompt_tokens (offline `LLM.generate` and both server endpoints) and
return_tokens_as_token_ids (logprobs naming tokens "token_id:{id}") through a real `pagedrt
serve` process on 127.0.0.1 (SmolLM2, CPU). Expected tokens come from `LLM.generate` in this
process over the manually truncated prompt; every wait is bounded."""

from __future__ import annotations

import json

import pytest
import server_http
import test_server
from server_http import greedy_one
from test_server import ENGINE_KWARGS, MODEL, wait_until_idle

from pagedrt import SamplingParams

# test_server's fixtures (pytest gives this module a server of its own)
server, llm, client = test_server.server, test_server.llm, test_server.client
http = server_http.http  # (a fixture: an httpx client on that server)

PROMPT = "The capital of France is Paris, and the capital of Italy is"
CHAT = [{"role": "user", "content": "Name three colours of the rainbow, please."}]




def test_llm_generate_keeps_the_last_k_tokens(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPT)
    k = 5
    assert len(ids) > k
    out = greedy_one(llm, PROMPT, truncate_prompt_tokens=k)
    expected = greedy_one(llm, ids[-k:])
    assert out.prompt_token_ids == ids[-k:]
    assert out.prompt == tok.decode(ids[-k:])  # the text of what ran
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    # k at least the prompt's length: nothing changes (the text as given)
    whole = greedy_one(llm, PROMPT, truncate_prompt_tokens=len(ids))
    assert whole.prompt == PROMPT and whole.prompt_token_ids == ids
    # -1: the most that leave room for max_tokens
    long_ids = (ids * 200)[: ENGINE_KWARGS["max_model_len"] + 50]
    out = greedy_one(llm, long_ids, max_tokens=4, truncate_prompt_tokens=-1)
    assert out.prompt_token_ids == long_ids[-(ENGINE_KWARGS["max_model_len"] - 4):]
    with pytest.raises(ValueError, match="^truncate_prompt_tokens=0 must be"):
        greedy_one(llm, PROMPT, truncate_prompt_tokens=0)
    # LLMEngine.add_request truncates too
    engine = llm.llm_engine
    req = engine.add_request("trunc", PROMPT, SamplingParams(max_tokens=1,
                                                            truncate_prompt_tokens=3))
    assert req.prompt_token_ids == ids[-3:] and req.prompt == tok.decode(ids[-3:])
    assert engine.abort_request("trunc")


def test_completions_truncate_echo_usage_and_prompt_logprobs(http, llm):
    """The last k tokens run (same greedy tokens as LLM.generate over them); usage counts k;
    echo leads with their text and its logprobs cover k tokens; prompt_logprobs has k
    entries; streamed echo too; k larger than the prompt changes nothing."""
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPT)
    k = 6
    kept = ids[-k:]
    expected = greedy_one(llm, kept).outputs[0]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "truncate_prompt_tokens": k}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    r = r.json()
    assert r["usage"]["prompt_tokens"] == k
    assert r["choices"][0]["text"] == tok.decode(expected.token_ids, skip_special_tokens=True)
    r = http.post("/v1/completions", json={**body, "echo": True, "logprobs": 0,
                                           "prompt_logprobs": 0}).json()
    choice = r["choices"][0]
    assert choice["text"] == tok.decode(kept) + tok.decode(expected.token_ids,
                                                           skip_special_tokens=True)
    assert choice["logprobs"]["tokens"][:k] == [tok.decode([t]) for t in kept]
    assert len(choice["logprobs"]["tokens"]) == k + 8
    assert choice["logprobs"]["token_logprobs"][0] is None  # the truncated prompt's first
    assert len(r["prompt_logprobs"]) == k and r["prompt_logprobs"][0] is None
    assert next(iter(r["prompt_logprobs"][1])) == str(kept[1])
    # streamed echo: the same text
    text = ""
    with http.stream("POST", "/v1/completions", json={**body, "echo": True,
                                                       "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0].get("text", "")
    assert text == choice["text"]
    # token-id prompts, a batch, and k beyond the prompt
    r = http.post("/v1/completions", json={**body, "prompt": [ids, ids[:4]]}).json()
    assert r["usage"]["prompt_tokens"] == k + 4
    plain = http.post("/v1/completions", json={**body, "truncate_prompt_tokens": 1000}).json()
    whole = greedy_one(llm, ids).outputs[0]
    assert plain["usage"]["prompt_tokens"] == len(ids)
    assert plain["choices"][0]["text"] == tok.decode(whole.token_ids, skip_special_tokens=True)


def test_chat_truncates_after_the_template(http, llm):
    tok = llm.get_tokenizer()
    t = http.post("/tokenize", json={"model": MODEL, "messages": CHAT}).json()
    k = 7
    expected = greedy_one(llm, t["tokens"][-k:]).outputs[0]
    r = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": CHAT, "max_tokens": 8, "temperature": 0,
        "truncate_prompt_tokens": k})
    assert r.status_code == 200, r.text
    r = r.json()
    assert r["usage"]["prompt_tokens"] == k
    assert r["choices"][0]["message"]["content"] == tok.decode(expected.token_ids,
                                                               skip_special_tokens=True)
    # -1: a short prompt fits whole, as without truncation
    r = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": CHAT, "max_tokens": 4, "truncate_prompt_tokens": -1})
    assert r.json()["usage"]["prompt_tokens"] == t["count"]


@pytest.mark.parametrize("path, base", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": CHAT}),
])
@pytest.mark.parametrize("value", [0, -2, True, 1.5, "3"])
def test_bad_truncate_prompt_tokens_is_a_400_naming_it(server, http, path, base, value):
    r = http.post(path, json={**base, "model": MODEL, "max_tokens": 2,
                              "truncate_prompt_tokens": value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "truncate_prompt_tokens", error
    assert "truncate_prompt_tokens" in error["message"]


@pytest.mark.parametrize("path, base", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": CHAT}),
])
def test_truncate_prompt_tokens_above_max_model_len_is_a_400(server, http, llm, path, base):
    """As vLLM: k above max_model_len is refused (offline too), naming both numbers; k equal
    to it is taken."""
    limit = ENGINE_KWARGS["max_model_len"]
    for value in (limit + 1, 2**62):
        r = http.post(path, json={**base, "model": MODEL, "max_tokens": 2,
                                  "truncate_prompt_tokens": value})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "truncate_prompt_tokens", error
        assert error["message"].startswith(
            f"truncate_prompt_tokens={value} is more than max_model_len={limit}"), error
    r = http.post(path, json={**base, "model": MODEL, "max_tokens": 2,
                              "truncate_prompt_tokens": limit})
    assert r.status_code == 200, r.text
    with pytest.raises(ValueError, match=f"^truncate_prompt_tokens={limit + 1} is more than "
                                         f"max_model_len={limit}: give at most {limit}"):
        greedy_one(llm, PROMPT, truncate_prompt_tokens=limit + 1)


def test_return_tokens_as_token_ids_completions(http, llm):
    """Every token of the logprobs (chosen, top, echoed prompt; streamed or not) is
    "token_id:{id}" with the ids LLM.generate gives; text_offset still counts the text."""
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPT)
    expected = greedy_one(llm, PROMPT, logprobs=2).outputs[0]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "logprobs": 2, "return_tokens_as_token_ids": True}
    plain = http.post("/v1/completions", json={**body, "return_tokens_as_token_ids": False})
    plain = plain.json()["choices"][0]
    r = http.post("/v1/completions", json=body).json()["choices"][0]
    assert r["text"] == plain["text"]
    lp = r["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in expected.token_ids]
    assert lp["text_offset"] == plain["logprobs"]["text_offset"]
    assert lp["token_logprobs"] == plain["logprobs"]["token_logprobs"]
    for token, top, e in zip(lp["tokens"], lp["top_logprobs"], expected.logprobs):
        assert token in top
        assert set(top) == {f"token_id:{t}" for t, _ in e.top_logprobs[:2]} | {token}
    # with echo: the prompt tokens too
    r = http.post("/v1/completions", json={**body, "echo": True}).json()["choices"][0]
    assert r["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids + expected.token_ids]
    # streamed
    tokens, offsets = [], []
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                if choice["logprobs"]:
                    tokens += choice["logprobs"]["tokens"]
                    offsets += choice["logprobs"]["text_offset"]
    assert tokens == lp["tokens"] and offsets == lp["text_offset"]


def test_return_tokens_as_token_ids_chat(http, llm):
    t = http.post("/tokenize", json={"model": MODEL, "messages": CHAT}).json()
    expected = greedy_one(llm, t["tokens"], logprobs=3).outputs[0]
    r = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": CHAT, "max_tokens": 8, "temperature": 0,
        "logprobs": True, "top_logprobs": 3, "return_tokens_as_token_ids": True})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in expected.token_ids]
    for c, e in zip(content, expected.logprobs):
        assert c["bytes"] == list(c["token"].encode())
        assert [x["token"] for x in c["top_logprobs"]] == [
            f"token_id:{t}" for t, _ in e.top_logprobs[:3]]


def test_no_block_is_held_after(server):
    assert wait_until_idle(server)["pagedrt_kv_blocks_used"] == 0
