"""The streaming handler in the API process, without a server or an engine: a stand-in for the
engine-core client finishes every request the moment it is added (as a fast engine can while
the handler's first write waits on the client), and the stream must still carry every token,
the finish reason and the usage, for both APIs."""

from __future__ import annotations

import asyncio
import json

import pytest

from pagedrt.engine.validation import EngineLimits
from pagedrt.entrypoints.core_client import RequestState
from pagedrt.entrypoints.engine_core import CoreInfo
from pagedrt.entrypoints.openai_server import OpenAIServer, _Run
from pagedrt.sampling_params import SamplingParams

TEXT = " Paris is the capital of France, and Lyon is"


class _InstantClient:
    """EngineCoreClient's surface for the handler: requests finish as they are added."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids
        self.info = CoreInfo(EngineLimits(49152, 2048, 256, 16, 256), "m", None, "cpu",
                             "float32", 0.0)
        self.alive = True
        self.states: dict[str, RequestState] = {}
        self.aborted: list[str] = []

    def add(self, state: RequestState, params: SamplingParams) -> None:
        for k in range(state.n):
            state.token_ids[k] += self.token_ids
            state.finish_reasons[k] = "length"
        state.num_finished = state.n
        state.run.wake.set()

    def abort(self, request_ids: list[str]) -> None:
        self.aborted += request_ids


class _Connection:
    """A Starlette request whose client never disconnects."""

    async def receive(self) -> dict:
        await asyncio.Event().wait()
        return {}


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_request_finished_before_the_first_wait_is_streamed_whole(smollm2, kind):
    tokenizer = smollm2.tokenizer
    token_ids = tokenizer.encode(TEXT)
    client = _InstantClient(token_ids)
    server = OpenAIServer(client, tokenizer, "m", None)
    params = SamplingParams(max_tokens=len(token_ids), n=2)
    run = _Run(client, tokenizer, _Connection(), "id", [[1, 2, 3]], params, 0.0, stream=True)

    async def collect() -> list[str]:
        return [piece async for piece in server._stream(run, kind, "id", True, 0, server.builder)]

    body = "".join(asyncio.run(collect()))
    events = [line[len("data: "):] for line in body.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts, finish = {0: "", 1: ""}, {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            piece = (choice.get("delta", {}).get("content") if kind == "chat"
                     else choice.get("text"))
            texts[choice["index"]] += piece or ""
            if choice.get("finish_reason"):
                finish[choice["index"]] = choice["finish_reason"]
    expected = tokenizer.decode(token_ids, skip_special_tokens=True)
    assert texts == {0: expected, 1: expected}
    assert finish == {0: "length", 1: "length"}
    assert chunks[-1]["usage"]["completion_tokens"] == 2 * len(token_ids)
    assert client.aborted == ["id-0"]  # every HTTP request ends by forgetting its states
