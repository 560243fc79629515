"""Helpers shared by the server test files that run a real `pagedrt serve` through
test_server's fixtures: an httpx client fixture on the module's server, a greedy
`LLM.generate` of one prompt (the expected tokens), and a streamed request's SSE chunks."""

from __future__ import annotations

import json

import httpx
import pytest
from test_server import AUTH

from pagedrt import LLM, SamplingParams


@pytest.fixture(scope="module")
def http(server):
    """An httpx client on the module's server (test_server's `server` fixture), with its key."""
    with httpx.Client(base_url=server, headers=AUTH, timeout=120) as h:
        yield h


def greedy_one(llm: LLM, prompt, max_tokens: int = 8, **kwargs):
    """The RequestOutput of a greedy `llm.generate` of `prompt` (text or token ids)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)
    return llm.generate([prompt], params, use_tqdm=False)[0]


def sse_chunks(http: httpx.Client, path: str, body: dict) -> list[dict]:
    """The JSON chunks of `body` posted to `path` with stream true ([DONE] left out)."""
    chunks = []
    with http.stream("POST", path, json={**body, "stream": True}) as s:
        assert s.status_code == 200, s.read()
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks
