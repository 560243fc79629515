"""vLLM's stream_options.continuous_usage_stats through a real `pagedrt serve` process on
127.0.0.1 (SmolLM2, CPU): with include_usage, every chunk with a choice carries that choice's
usage so far (its prompt's tokens, the tokens it has generated so far), as vLLM counts it, on
both endpoints, with n > 1 and a batch of prompts; without it (or without include_usage) the
chunks are as before. Every wait is bounded."""

from __future__ import annotations

import pytest
import server_http
import test_server
from server_http import sse_chunks
from test_server import MODEL

# test_server's fixtures (pytest gives this module a server of its own)
server, llm, client = test_server.server, test_server.llm, test_server.client
http = server_http.http  # (a fixture: an httpx client on that server)

PROMPT = "The capital of France is Paris, and the capital of Italy is"
OTHER = "Once upon a time, in a small village,"
CHAT = [{"role": "user", "content": "Name three colours of the rainbow, please."}]
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
MAX_TOKENS = 10




def _num_tokens(http, **body) -> int:
    r = http.post("/tokenize", json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def _check_continuous(chunks: list[dict], prompt_tokens: list[int], n: int,
                      completion_tokens: int) -> list:
    """Every chunk with a choice has that choice's usage: its prompt's tokens (prompt_tokens[i]
    for prompt i; choice index = prompt * n + sample) and its count so far, never decreasing
    per choice, each choice ending at completion_tokens; the final usage-only chunk has the
    request's sums. Returns the usages in order."""
    *body, last = chunks
    num_choices = len(prompt_tokens) * n
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": sum(prompt_tokens), "completion_tokens": num_choices * completion_tokens,
        "total_tokens": sum(prompt_tokens) + num_choices * completion_tokens}
    assert body and all(len(chunk["choices"]) == 1 for chunk in body)
    per_choice: dict[int, list[int]] = {}
    for chunk in body:
        index, u = chunk["choices"][0]["index"], chunk["usage"]
        assert u["prompt_tokens"] == prompt_tokens[index // n]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        per_choice.setdefault(index, []).append(u["completion_tokens"])
    assert sorted(per_choice) == list(range(num_choices))
    for counts in per_choice.values():
        assert counts == sorted(counts) and counts[-1] == completion_tokens
        assert 0 <= counts[0] < completion_tokens
    return [chunk["usage"] for chunk in body]


def _completion_body(**extra) -> dict:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, **extra}


def test_completions_every_chunk_carries_the_usage_so_far(http):
    prompt_tokens = _num_tokens(http, prompt=PROMPT)
    chunks = sse_chunks(http, "/v1/completions",
                     _completion_body(stream_options=CONTINUOUS, return_token_ids=True))
    _check_continuous(chunks, [prompt_tokens], 1, MAX_TOKENS)
    assert len(chunks) > 3  # (several chunks, not one at the end)
    sent = 0
    for chunk in chunks[:-1]:  # never fewer than the ids already sent
        sent += sum(len(c["token_ids"]) for c in chunk["choices"])
        assert chunk["usage"]["completion_tokens"] >= sent
    assert sent == MAX_TOKENS
    # the text is the same as without the option
    plain = sse_chunks(http, "/v1/completions", _completion_body())
    assert ("".join(c["text"] for ch in chunks for c in ch["choices"])
            == "".join(c["text"] for ch in plain for c in ch["choices"]))


def test_chat_every_chunk_carries_the_usage_so_far_role_chunk_included(http):
    prompt_tokens = _num_tokens(http, messages=CHAT)
    chunks = sse_chunks(http, "/v1/chat/completions", {
        "model": MODEL, "messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True, "stream_options": CONTINUOUS})
    usages = _check_continuous(chunks, [prompt_tokens], 1, MAX_TOKENS)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert usages[0]["completion_tokens"] == 0


def test_completions_n_2_each_choice_counts_its_own_tokens(http):
    prompt_tokens = _num_tokens(http, prompt=PROMPT)
    chunks = sse_chunks(http, "/v1/completions", _completion_body(
        n=2, temperature=0.8, seed=7, stream_options=CONTINUOUS))
    _check_continuous(chunks, [prompt_tokens], 2, MAX_TOKENS)


def test_completions_batch_of_two_prompts_each_choice_counts_its_own_prompt(http):
    prompt_tokens = [_num_tokens(http, prompt=PROMPT), _num_tokens(http, prompt=OTHER)]
    assert prompt_tokens[0] != prompt_tokens[1]  # (so that a mix-up shows)
    chunks = sse_chunks(http, "/v1/completions", _completion_body(
        prompt=[PROMPT, OTHER], n=2, temperature=0.8, seed=3, stream_options=CONTINUOUS))
    _check_continuous(chunks, prompt_tokens, 2, MAX_TOKENS)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", _completion_body()),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": MAX_TOKENS,
                              "temperature": 0, "ignore_eos": True}),
])
def test_without_the_option_only_the_last_chunk_has_usage(http, path, body):
    for options, final_usage in (({"include_usage": True}, True),
                                 ({"include_usage": True, "continuous_usage_stats": False},
                                  True),
                                 # vLLM's rule: no include_usage, no usage at all
                                 ({"continuous_usage_stats": True}, False),
                                 ({"include_usage": False, "continuous_usage_stats": True},
                                  False),
                                 (None, False)):
        chunks = sse_chunks(http, path, {**body, "stream_options": options})
        body_chunks = chunks[:-1] if final_usage else chunks
        assert body_chunks and all("usage" not in chunk for chunk in body_chunks), options
        if final_usage:
            assert chunks[-1]["choices"] == []
            assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS
