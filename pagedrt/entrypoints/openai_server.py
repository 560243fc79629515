"""OpenAI-compatible HTTP server: `pagedrt serve`.

    GET  /v1/models            the served model
    POST /v1/completions       prompt (text, token ids, or a batch of either)
    POST /v1/chat/completions  messages, through the model's chat template
    GET  /health               200 while the engine thread runs
    GET  /metrics              Prometheus text format (see pagedrt.entrypoints.metrics)

One HTTP request becomes one engine request per prompt (each with n samples); their outputs
arrive on one asyncio.Queue from the engine thread (see async_engine.py). Streaming sends each
step's `delta_text`, which the engine's detokenizer already holds back while it could still
become a stop string or while it ends inside a UTF-8 character, so the concatenated stream is
the non-streamed text. A client that goes away (streaming or not) has its requests aborted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from pagedrt.engine.llm_engine import LLMEngine
from pagedrt.entrypoints.async_engine import AsyncEngine
from pagedrt.entrypoints.metrics import CONTENT_TYPE, ServerMetrics
from pagedrt.entrypoints.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    api_error_from_validation,
    api_error_from_value_error,
)
from pagedrt.entrypoints.response import ResponseBuilder
from pagedrt.outputs import RequestOutput
from pagedrt.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Run:
    """The engine requests of one HTTP request: their shared queue and a disconnect watcher.

    Use as `async with`: leaving it for any reason (done, error, cancellation, disconnect)
    aborts what is still running, which frees the blocks of all n samples.
    """

    def __init__(self, async_engine: AsyncEngine, request: Request, base_id: str,
                 prompts: list[list[int]], params: SamplingParams, arrival_time: float,
                 stream: bool) -> None:
        self.async_engine, self.request, self.stream = async_engine, request, stream
        self.prompts, self.params, self.arrival_time = prompts, params, arrival_time
        self.request_ids = [f"{base_id}-{i}" for i in range(len(prompts))]
        self.prompt_index = {rid: i for i, rid in enumerate(self.request_ids)}
        self.unfinished = set(self.request_ids)
        self.final: dict[str, RequestOutput] = {}
        self.queue: asyncio.Queue = asyncio.Queue()
        self._watcher: asyncio.Task | None = None

    async def __aenter__(self) -> _Run:  # noqa: PYI034 - private, never subclassed; Self is 3.11+
        for rid, token_ids in zip(self.request_ids, self.prompts):
            self.async_engine.add_request(rid, token_ids, self.params, self.queue,
                                          self.arrival_time, self.stream)
        self._watcher = asyncio.create_task(self._watch_disconnect())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        self._abort_unfinished()

    async def next(self) -> RequestOutput | None:
        """The next output of any of the requests; None once the client is gone."""
        item = await self.queue.get()
        if item is None:
            return None
        if isinstance(item, ValueError):
            raise APIError(400, str(item))
        if isinstance(item, BaseException):
            raise APIError(500, str(item), type="server_error")
        if item.finished:
            self.unfinished.discard(item.request_id)
            self.final[item.request_id] = item
        return item

    def _abort_unfinished(self) -> None:
        for rid in self.unfinished:
            self.async_engine.abort(rid)
        self.unfinished.clear()

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                self._abort_unfinished()
                self.queue.put_nowait(None)
                return


class OpenAIServer:
    """Turns validated bodies into engine requests and engine outputs into OpenAI responses."""

    def __init__(self, engine: LLMEngine, async_engine: AsyncEngine, served_model_name: str,
                 api_key: str | None) -> None:
        self.engine, self.async_engine = engine, async_engine
        self.served_model_name, self.api_key = served_model_name, api_key
        self.builder = ResponseBuilder(engine.tokenizer, served_model_name)

    # ------------------------------------------------------------ checks
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(),
                                                                    self.api_key.encode()):
            raise APIError(401, "missing or incorrect API key; send 'Authorization: Bearer KEY'",
                           type="authentication_error", code="invalid_api_key")

    async def parse(self, request: Request, model_cls):
        self.check_auth(request)
        try:
            body = model_cls.model_validate_json(await request.body())
        except ValidationError as e:
            raise api_error_from_validation(e) from None
        if body.model is not None and body.model != self.served_model_name:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                           f"{self.served_model_name!r}", param="model", code="model_not_found")
        return body

    def _tokenize(self, text: str, field: str) -> list[int]:
        if not text:
            raise APIError(400, f"{field} is empty; give at least one token", param=field)
        if self.engine.tokenizer is None:
            raise APIError(400, "this model has no tokenizer; send token ids", param=field)
        return self.engine.tokenize(text)

    def _validate(self, prompts: list[list[int]], params: SamplingParams, field: str) -> None:
        max_num_seqs = self.engine.config.max_num_seqs
        if params.n > max_num_seqs:
            raise APIError(400, f"n={params.n} exceeds max_num_seqs={max_num_seqs}; ask for "
                           "fewer samples or start the server with a larger --max-num-seqs",
                           param="n")
        for token_ids in prompts:
            try:
                self.engine.validate_prompt(token_ids, params)
            except ValueError as e:
                raise api_error_from_value_error(e, field) from None

    # ------------------------------------------------------------ endpoints
    async def completions(self, request: Request) -> Response:
        arrival_time = time.monotonic()
        body: CompletionRequest = await self.parse(request, CompletionRequest)
        if body.echo:
            raise APIError(400, "echo=true is not supported", param="echo")
        if body.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        prompt = body.prompt
        if isinstance(prompt, str):
            prompts = [self._tokenize(prompt, "prompt")]
        elif not prompt:
            raise APIError(400, "prompt is empty; give at least one token", param="prompt")
        elif isinstance(prompt[0], str):
            prompts = [self._tokenize(p, "prompt") for p in prompt]
        elif isinstance(prompt[0], int):
            prompts = [list(prompt)]
        else:
            prompts = [list(p) for p in prompt]
        max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's default
        try:
            params = body.to_sampling_params(max_tokens, body.logprobs)
        except ValueError as e:
            raise api_error_from_value_error(e, "prompt") from None
        self._validate(prompts, params, "prompt")
        return await self._respond(request, "completion", body, prompts, params, arrival_time)

    async def chat_completions(self, request: Request) -> Response:
        arrival_time = time.monotonic()
        body: ChatCompletionRequest = await self.parse(request, ChatCompletionRequest)
        if not body.messages:
            raise APIError(400, "messages is empty; give at least one message", param="messages")
        tok = self.engine.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise APIError(400, "this model has no chat template; use /v1/completions",
                           param="messages")
        conversation = [m.to_template_dict() for m in body.messages]
        add_generation_prompt = body.add_generation_prompt is not False
        try:
            text = tok.apply_chat_template(conversation, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
        except Exception as e:  # noqa: BLE001 - a template may refuse a role order or name
            raise APIError(400, f"chat template failed: {e}", param="messages") from None
        prompts = [self._tokenize(text, "messages")]
        max_tokens = body.max_completion_tokens
        if max_tokens is None:
            max_tokens = body.max_tokens
        if max_tokens is None:  # as much as fits (OpenAI's default for chat)
            capacity = self.engine.kv_manager.num_blocks * self.engine.kv_manager.block_size
            max_tokens = max(1, min(self.engine.max_model_len, capacity) - len(prompts[0]))
        if body.logprobs:
            logprobs = 0 if body.top_logprobs is None else body.top_logprobs
        elif body.top_logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        else:
            logprobs = None
        try:
            params = body.to_sampling_params(max_tokens, logprobs)
        except ValueError as e:
            error = api_error_from_value_error(e, "messages")
            if error.param == "logprobs":
                error.param = "top_logprobs"
            raise error from None
        self._validate(prompts, params, "messages")
        return await self._respond(request, "chat", body, prompts, params, arrival_time)

    # ------------------------------------------------------------ responses
    async def _respond(self, request: Request, kind: str, body, prompts: list[list[int]],
                       params: SamplingParams, arrival_time: float) -> Response:
        base_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        run = _Run(self.async_engine, request, base_id, prompts, params, arrival_time,
                   stream=bool(body.stream))
        if body.stream:
            return StreamingResponse(self._stream(run, kind, base_id, body.include_usage),
                                     media_type="text/event-stream", headers=_SSE_HEADERS)
        async with run:
            while run.unfinished:
                if await run.next() is None:  # the client is gone; nobody reads this
                    return Response(status_code=499)
        finals = [run.final[rid] for rid in run.request_ids]
        return JSONResponse(self.builder.full_response(kind, base_id, finals, params.n))

    async def _stream(self, run: _Run, kind: str, base_id: str, include_usage: bool):
        """Server-sent events; requests are added only once the response streams, so a client
        that leaves before the first byte never starts one."""
        stream = self.builder.stream(kind, base_id, run.params.n, len(run.prompts))
        try:
            async with run:
                for chunk in stream.start():
                    yield _sse(chunk)
                while run.unfinished:
                    out = await run.next()
                    if out is None:
                        return
                    for chunk in stream.update(run.prompt_index[out.request_id], out):
                        yield _sse(chunk)
            if include_usage:
                yield _sse(stream.usage_chunk([run.final[rid] for rid in run.request_ids]))
        except APIError as e:
            yield _sse(e.body())
        yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status_code)


def build_app(engine: LLMEngine, served_model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI app; its lifespan starts and stops the engine thread."""
    metrics = ServerMetrics()
    async_engine = AsyncEngine(engine, metrics)
    metrics.bind(lambda: async_engine.stats)
    server = OpenAIServer(engine, async_engine, served_model_name, api_key)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        try:
            yield
        finally:
            async_engine.shutdown()

    app = FastAPI(title="pagedrt", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        return _error_response(APIError(e.status_code, str(e.detail), type=kind))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return _error_response(APIError(400, str(e.errors())))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return _error_response(APIError(500, f"internal error: {e!r}", type="server_error"))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if async_engine.is_alive else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        server.check_auth(request)
        card = {"id": served_model_name, "object": "model", "created": int(time.time()),
                "owned_by": "pagedrt", "root": engine.model_path,
                "max_model_len": engine.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    app.post("/v1/completions")(server.completions)
    app.post("/v1/chat/completions")(server.chat_completions)
    return app


def run_server(args) -> int:
    """`pagedrt serve`: load the model, then serve until interrupted ($PAGEDRT_NUM_THREADS is
    applied by the `pagedrt` command for every subcommand)."""
    import uvicorn

    from pagedrt.config import EngineConfig
    from pagedrt.entrypoints.engine_args import engine_kwargs

    engine = LLMEngine(args.model, EngineConfig(**engine_kwargs(args)), dtype=args.dtype,
                       device=args.device)
    name = args.served_model_name or _default_model_name(args.model or engine.model_path)
    app = build_app(engine, name, args.api_key)
    print(f"pagedrt: serving {name!r} on http://{args.host}:{args.port} "
          f"(device {engine.device}, max_model_len {engine.max_model_len}, "
          f"{engine.kv_manager.num_blocks} KV blocks)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=5,
                log_level="info" if getattr(args, "verbose", False) else "warning")
    return 0


def _default_model_name(path: str) -> str:
    """"SmolLM2-135M-Instruct" for .../SmolLM2-135M-Instruct.Q4_1.gguf; a folder's name."""
    name = os.path.basename(os.path.normpath(path))
    if name.endswith(".gguf"):
        name = name[: -len(".gguf")]
        stem, dot, quant = name.rpartition(".")
        name = stem if dot and quant[:1] in "QFIB" else name
    return name
