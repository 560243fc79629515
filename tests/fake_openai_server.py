"""A fake OpenAI-compatible server with known timings, for tests of `pagedrt bench serve`.

FastAPI on uvicorn in a thread, on a free port of 127.0.0.1. Every completion is `max_tokens`
chunks of text "x" (chat: a role-only chunk first, then "x" deltas): the first after
`first_token_delay_s`, each next one `token_delay_s` later, then a usage chunk (when asked
for and `send_usage`) and [DONE]. A prompt's first token id selects a misbehaviour: in
`fail_ids` -> HTTP 500, `error_event_ids` -> an error event after the first chunk,
`slow_ids` -> the first chunk after `slow_delay_s`, `hang_ids` -> nothing for `hang_s`,
`truncate_ids` -> the stream ends after the first chunk, without [DONE].
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "fake-model"


@dataclasses.dataclass
class Behaviour:
    first_token_delay_s: float = 0.02
    token_delay_s: float = 0.005
    slow_delay_s: float = 0.6
    hang_s: float = 5.0
    fail_ids: set = dataclasses.field(default_factory=set)
    error_event_ids: set = dataclasses.field(default_factory=set)
    slow_ids: set = dataclasses.field(default_factory=set)
    hang_ids: set = dataclasses.field(default_factory=set)
    truncate_ids: set = dataclasses.field(default_factory=set)
    send_usage: bool = True
    card: dict = dataclasses.field(default_factory=lambda: {"max_model_len": 4096})


@dataclasses.dataclass
class Seen:
    """What the fake received (read from the test thread after a run)."""

    bodies: list = dataclasses.field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def build_app(behaviour: Behaviour, seen: Seen) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list",
                             "data": [{"id": MODEL, "object": "model", **behaviour.card}]})

    async def complete(request: Request, chat: bool):
        body = await request.json()
        seen.bodies.append(body)
        if body.get("model") != MODEL:
            return JSONResponse({"error": {"message": f"no model {body.get('model')!r}"}},
                                status_code=404)
        prompt = body.get("prompt")
        first_id = prompt[0] if isinstance(prompt, list) else None
        n = body["max_completion_tokens"] if chat else body["max_tokens"]
        if first_id in behaviour.fail_ids:
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
        first_delay = (behaviour.slow_delay_s if first_id in behaviour.slow_ids
                       else behaviour.first_token_delay_s)
        if first_id in behaviour.hang_ids:
            first_delay = behaviour.hang_s
        usage = {"prompt_tokens": len(prompt) if first_id is not None else 7,
                 "completion_tokens": n,
                 "total_tokens": (len(prompt) if first_id is not None else 7) + n}

        def chunk(i: int) -> dict:
            finish = "length" if i == n - 1 else None
            choice = ({"index": 0, "delta": {"content": "x"}, "finish_reason": finish} if chat
                      else {"index": 0, "text": "x", "finish_reason": finish})
            return {"id": "cmpl-fake", "choices": [choice]}

        if not body.get("stream"):
            seen.in_flight += 1
            seen.max_in_flight = max(seen.max_in_flight, seen.in_flight)
            try:
                await asyncio.sleep(first_delay + (n - 1) * behaviour.token_delay_s)
            finally:
                seen.in_flight -= 1
            text = "x" * n
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                      else {"index": 0, "text": text})
            return JSONResponse({"id": "cmpl-fake", "choices": [choice],
                                 **({"usage": usage} if behaviour.send_usage else {})})

        async def events():
            seen.in_flight += 1
            seen.max_in_flight = max(seen.max_in_flight, seen.in_flight)
            try:
                if chat:
                    yield _sse({"choices": [{"index": 0, "delta": {"role": "assistant",
                                                                    "content": ""}}]})
                await asyncio.sleep(first_delay)
                for i in range(n):
                    if i:
                        await asyncio.sleep(behaviour.token_delay_s)
                    if i == 1 and first_id in behaviour.error_event_ids:
                        yield _sse({"error": {"message": "injected error event"}})
                        yield "data: [DONE]\n\n"
                        return
                    yield _sse(chunk(i))
                    if first_id in behaviour.truncate_ids:
                        return
                include = (body.get("stream_options") or {}).get("include_usage")
                if include and behaviour.send_usage:
                    yield _sse({"id": "cmpl-fake", "choices": [], "usage": usage})
                yield "data: [DONE]\n\n"
            finally:
                seen.in_flight -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    return app


class FakeServer:
    """Start with `with FakeServer(behaviour) as fake:`; `fake.url` is its base URL."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.seen = Seen()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.behaviour, self.seen), log_level="warning",
                                lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> FakeServer:  # noqa: PYI034 - never subclassed; Self is 3.11+
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake server did not start in 20 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
