"""vLLM's return_token_ids (the prompt's and the generated token ids in the response) through a
real `pagedrt serve` process on 127.0.0.1 (SmolLM2, CPU): both endpoints, streamed or not,
n > 1, a batch of prompts, truncate_prompt_tokens, echo, logprobs and a stop string. Expected
ids come from `LLM.generate` greedy in this process; every wait is bounded."""

from __future__ import annotations

import server_http
import test_server
from server_http import greedy_one, sse_chunks
from test_server import MODEL, wait_until_idle

# test_server's fixtures (pytest gives this module a server of its own)
server, llm, client = test_server.server, test_server.llm, test_server.client
http = server_http.http  # (a fixture: an httpx client on that server)

PROMPT = "The capital of France is Paris, and the capital of Italy is"
OTHER = "Once upon a time, in a small village,"
CHAT = [{"role": "user", "content": "Name three colours of the rainbow, please."}]




def _tokens(http, **body) -> list[int]:
    r = http.post("/tokenize", json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]



def _streamed(chunks: list[dict], kind: str) -> dict[int, dict]:
    """Per choice index: its text, its token_ids concatenated, and the prompt_token_ids of
    each chunk that had them (completions: choice level)."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            got = out.setdefault(c["index"], {"text": "", "ids": [], "prompt_ids": [],
                                              "chunks": 0})
            got["chunks"] += 1
            got["text"] += (c["delta"].get("content") or "") if kind == "chat" else c["text"]
            got["ids"] += c.get("token_ids", [])
            if "prompt_token_ids" in c:
                got["prompt_ids"].append((got["chunks"], c["prompt_token_ids"]))
    return out


def test_completions_ids_match_llm_generate_and_are_absent_without_the_field(http, llm):
    ids = _tokens(http, prompt=PROMPT)
    expected = greedy_one(llm, PROMPT).outputs[0]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    r = http.post("/v1/completions", json={**body, "return_token_ids": True})
    assert r.status_code == 200, r.text
    r = r.json()
    choice = r["choices"][0]
    assert choice["prompt_token_ids"] == ids
    assert choice["token_ids"] == expected.token_ids
    assert "prompt_token_ids" not in r and "token_ids" not in r
    plain = http.post("/v1/completions", json=body).json()
    assert choice["text"] == plain["choices"][0]["text"]
    for without in (plain, http.post("/v1/completions",
                                     json={**body, "return_token_ids": False}).json()):
        assert set(without["choices"][0]) == {"index", "text", "logprobs", "finish_reason",
                                              "stop_reason"}
        assert "prompt_token_ids" not in without
    for chunk in sse_chunks(http, "/v1/completions", body):
        assert all("token_ids" not in c and "prompt_token_ids" not in c
                   for c in chunk["choices"])


def test_completions_batch_n2_streamed_equals_non_streamed(http, llm):
    """A batch of two prompts with n=2: every choice's ids are LLM.generate's for its prompt;
    streamed, each choice's first chunk alone has prompt_token_ids and its chunks' token_ids
    together are the non-streamed ones."""
    prompts = [PROMPT, OTHER]
    ids = [_tokens(http, prompt=p) for p in prompts]
    expected = [greedy_one(llm, p).outputs[0].token_ids for p in prompts]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 8, "temperature": 0, "n": 2,
            "return_token_ids": True}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for c in choices:
        assert c["prompt_token_ids"] == ids[c["index"] // 2]
        assert c["token_ids"] == expected[c["index"] // 2]
    streamed = _streamed(sse_chunks(http, "/v1/completions", body), "completion")
    assert sorted(streamed) == [0, 1, 2, 3]
    for c in choices:
        got = streamed[c["index"]]
        assert got["ids"] == c["token_ids"] and got["text"] == c["text"]
        assert got["prompt_ids"] == [(1, c["prompt_token_ids"])]


def test_completions_truncate_echo_logprobs_and_stop(http, llm):
    ids = _tokens(http, prompt=PROMPT)
    k = 6
    kept = ids[-k:]
    expected = greedy_one(llm, kept).outputs[0]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "truncate_prompt_tokens": k, "return_token_ids": True}
    # truncated: the kept ids; echo adds the prompt's text, not ids
    for extra in ({}, {"echo": True}, {"logprobs": 1, "return_tokens_as_token_ids": True}):
        r = http.post("/v1/completions", json={**body, **extra})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["prompt_token_ids"] == kept
        assert choice["token_ids"] == expected.token_ids
        if extra.get("logprobs"):
            assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in expected.token_ids]
        streamed = _streamed(sse_chunks(http, "/v1/completions", {**body, **extra}), "completion")
        assert streamed[0]["ids"] == choice["token_ids"]
        assert streamed[0]["prompt_ids"] == [(1, kept)]
        assert streamed[0]["text"] == choice["text"]
    # a stop string: the ids are CompletionOutput.token_ids (LLM.generate's with the stop)
    whole = greedy_one(llm, PROMPT, max_tokens=12).outputs[0]
    stop = llm.get_tokenizer().decode(whole.token_ids[3:5]).strip()
    assert stop
    stopped = greedy_one(llm, PROMPT, max_tokens=12, stop=[stop]).outputs[0]
    assert stopped.finish_reason == "stop"
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
            "stop": [stop], "return_token_ids": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == stopped.text
    assert choice["token_ids"] == stopped.token_ids
    streamed = _streamed(sse_chunks(http, "/v1/completions", body), "completion")
    assert streamed[0]["ids"] == stopped.token_ids and streamed[0]["text"] == stopped.text


def test_chat_ids_streamed_or_not(http, llm):
    prompt_ids = _tokens(http, messages=CHAT)
    expected = greedy_one(llm, prompt_ids).outputs[0]
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 8, "temperature": 0, "n": 2,
            "return_token_ids": True}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    r = r.json()
    assert r["prompt_token_ids"] == prompt_ids
    for c in r["choices"]:
        assert c["token_ids"] == expected.token_ids
        assert "prompt_token_ids" not in c
    chunks = sse_chunks(http, "/v1/chat/completions", body)
    openers = [ch for ch in chunks if ch["choices"] and "role" in ch["choices"][0]["delta"]]
    assert len(openers) == 2 and all(ch["prompt_token_ids"] == prompt_ids for ch in openers)
    assert all("prompt_token_ids" not in ch for ch in chunks if ch not in openers)
    streamed = _streamed(chunks, "chat")
    for c in r["choices"]:
        assert streamed[c["index"]]["ids"] == c["token_ids"]
        assert streamed[c["index"]]["text"] == c["message"]["content"]
    # truncated after the template
    k = 7
    r = http.post("/v1/chat/completions", json={**body, "n": 1, "truncate_prompt_tokens": k})
    r = r.json()
    assert r["prompt_token_ids"] == prompt_ids[-k:]
    assert r["choices"][0]["token_ids"] == greedy_one(llm, prompt_ids[-k:]).outputs[0].token_ids
    # without the field: neither key, streamed or not
    plain = {key: v for key, v in body.items() if key != "return_token_ids"}
    r = http.post("/v1/chat/completions", json=plain).json()
    assert "prompt_token_ids" not in r and all("token_ids" not in c for c in r["choices"])
    for ch in sse_chunks(http, "/v1/chat/completions", plain):
        assert "prompt_token_ids" not in ch
        assert all("token_ids" not in c for c in ch["choices"])


def test_no_block_is_held_after(server):
    assert wait_until_idle(server)["pagedrt_kv_blocks_used"] == 0


def test_min_tokens_with_a_stop_string(http, llm):
    """A stop string inside the first min_tokens tokens neither stops the request nor cuts
    its text (as vLLM): the text runs to the first "," that ends after them, offline, and
    through the server streamed or not, with the same token ids."""
    tok = llm.get_tokenizer()
    prompt, k = "1, 2, 3,", 8
    out = greedy_one(llm, prompt, max_tokens=20, min_tokens=k, stop=[","]).outputs[0]
    full, first = (tok.decode(ids, skip_special_tokens=True)
                   for ids in (out.token_ids, out.token_ids[:k]))
    assert "," in first  # (else this would test nothing)
    assert out.finish_reason == "stop" and out.stop_reason == ","
    assert len(out.token_ids) > k and out.text == full[: full.index(",", len(first))]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0,
            "min_tokens": k, "stop": [","], "return_token_ids": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["finish_reason"]) == (
        out.text, out.token_ids, "stop")
    streamed = _streamed(sse_chunks(http, "/v1/completions", body), "completion")
    assert streamed[0]["ids"] == out.token_ids and streamed[0]["text"] == out.text
