"""OpenAI-compatible HTTP server: `pagedrt serve`.

    GET  /v1/models            the served model
    POST /v1/completions       prompt (text, token ids, or a batch of either)
    POST /v1/chat/completions  messages, through the model's chat template
    POST /tokenize             a prompt's or a chat's token ids (vLLM's; no engine round trip)
    POST /detokenize           the text of token ids (vLLM's)
    GET  /health               200 while the engine core runs and no shutdown is under way
    GET  /metrics              Prometheus text format (see pagedrt.entrypoints.metrics)

This module is the API process: it validates, tokenizes, applies chat templates, detokenizes
and writes SSE; the engine runs in the engine-core process (engine_core.py, core_client.py;
docs/design.md has the process layout). One HTTP request becomes one engine request per prompt
(each with n samples), sharing one `RequestRun` that the handler waits on. A stream sends, each
time the handler wakes, every token that arrived since (coalesced: a slow client gets fewer,
larger chunks and slows no one). Text comes from an `IncrementalDetokenizer` per sample, which
holds text back while it could still become a stop string or while it ends inside a UTF-8
character, so the concatenated stream is the non-streamed text. A client that goes away
(streaming or not) has its requests aborted.

Echo-only scoring (completions, `echo=true` with `max_tokens=0`, as OpenAI's legacy completions
and vLLM take it): each prompt runs as a request of max_tokens=1 (with prompt logprobs where
`logprobs` is set), and the one token it makes is left out of the response: each choice's text
is its prompt's text, its logprobs cover the prompt tokens only, finish_reason is "length"
(also where the token was EOS or a stop), usage counts no completion token; a stream sends each
choice's prompt and finish in one chunk. With n > 1, n equal choices (each sample still takes
its step, so n counts against max_num_seqs as usual). A prompt may then have max_model_len - 1
tokens at most.

Faults: if the engine core dies, every open request ends at once with a 503 (500 with the
fault where the core said it stopped on a worker's fault; an error event, then `[DONE]`, on a
stream), `/health` and new requests answer 503, and the process exits with
status 1 `DEAD_CORE_EXIT_DELAY_S` later (the launcher then exits non-zero: restarting is left to
the supervisor that started the server). SIGTERM stops admission (uvicorn closes the
listening socket within a fraction of a second, so a new connection is refused; a request
that still reaches the app gets 503), gives open requests `--shutdown-timeout` seconds to
finish, fails the rest with an error, and exits.

Hostile input: guards.py checks Host, API key, content type, body size and read times before
a handler runs; prompt_input.py bounds prompt counts and lengths before tokenizing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from pagedrt.engine.bad_words import resolve_bad_words
from pagedrt.engine.detokenizer import IncrementalDetokenizer
from pagedrt.engine.validation import max_tokens_that_fit, truncate_prompt, validate_prompt
from pagedrt.entrypoints.chat_template import ChatTemplateError, render_chat
from pagedrt.entrypoints.core_client import EngineCoreClient, RequestRun, RequestState
from pagedrt.entrypoints.guards import HttpOptions, install_guards
from pagedrt.entrypoints.metrics import CONTENT_TYPE, ServerMetrics
from pagedrt.entrypoints.prompt_input import PromptInput
from pagedrt.entrypoints.protocol import (
    UNSUPPORTED,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    api_error_from_validation,
    api_error_from_value_error,
)
from pagedrt.entrypoints.response import ResponseBuilder, StreamState
from pagedrt.outputs import CompletionOutput, RequestOutput
from pagedrt.sampling_params import (
    SamplingParams,
    check_truncate_prompt_tokens,
    short_repr,
    short_text,
)

logger = logging.getLogger(__name__)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# Seconds the process keeps answering 503 after the engine core died, then exits with 1.
DEAD_CORE_EXIT_DELAY_S = 3.0

# /detokenize decodes lists up to this many ids on the event loop, longer ones on a thread.
INLINE_TOKENS = 4096


def _stop_terminated(finish_reason: str | None, stop_reason) -> bool:
    """Whether a sample's last token ended it as a stop token (EOS: no stop reason; or one of
    stop_token_ids: that id), whose text is then left out (`IncrementalDetokenizer.update`),
    not by a stop string or its length."""
    return finish_reason == "stop" and not isinstance(stop_reason, str)


class _Run:
    """The engine requests of one HTTP request: their states, detokenizers and a disconnect
    watcher.

    Use as `async with`: leaving it for any reason (done, error, cancellation, disconnect)
    aborts what is still running, which frees the blocks of all n samples.
    """

    def __init__(self, client: EngineCoreClient, tokenizer, request: Request, base_id: str,
                 prompts: list[list[int]], params: SamplingParams, arrival_time: float,
                 stream: bool, echo: list[str] | None = None, echo_only: bool = False) -> None:
        """echo: each prompt's text, which its outputs' `prompt` carries (completions with
        echo=true), or None. echo_only (echo with max_tokens=0): the engine runs each sample
        for its one token (params.max_tokens is 1), which the outputs leave out: no token,
        no text, finish_reason "length"."""
        self.client, self.request, self.stream = client, request, stream
        self.prompts, self.params, self.echo = prompts, params, echo
        self.echo_only = echo_only
        self.run = RequestRun()
        self.states = [RequestState(f"{base_id}-{i}", p, params.n, self.run, arrival_time,
                                    prompt_logprobs=params.prompt_logprobs is not None)
                       for i, p in enumerate(prompts)]
        self.detokenizers = [[None if tokenizer is None or echo_only
                              else IncrementalDetokenizer(tokenizer, p, params)
                              for _ in range(params.n)] for p in prompts]
        self.num_sent = [[0] * params.n for _ in prompts]  # tokens turned into text so far
        self.sent_final = [[False] * params.n for _ in prompts]
        self._watcher: asyncio.Task | None = None
        self.gone = False  # the client disconnected

    async def __aenter__(self) -> _Run:  # noqa: PYI034 - private, never subclassed; Self is 3.11+
        for state in self.states:
            self.client.add(state, self.params)
        self._watcher = asyncio.create_task(self._watch_disconnect())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        self._abort_unfinished()

    @property
    def finished(self) -> bool:
        return all(state.finished for state in self.states)

    async def wait(self) -> None:
        """Until something new arrived; raises APIError if a request failed."""
        run = self.run
        await run.wake.wait()
        run.wake.clear()
        if run.error_status:
            raise APIError(run.error_status, run.error)

    def new_outputs(self):
        """(prompt index, CompletionOutput with the text and state since the last call) for
        every sample that got tokens or finished since."""
        for p, state in enumerate(self.states):
            for k in range(state.n):
                tokens, logprobs, finish_reason, stop_reason = self._sample(state, k)
                start = self.num_sent[p][k]
                if start == len(tokens) and (finish_reason is None or self.sent_final[p][k]):
                    continue
                self.num_sent[p][k] = len(tokens)
                done = finish_reason is not None
                self.sent_final[p][k] = done
                delta = ""
                detokenizer = self.detokenizers[p][k]
                if detokenizer is not None:
                    detokenizer.update(tokens[start:], _stop_terminated(finish_reason,
                                                                        stop_reason))
                    delta = detokenizer.get_delta(done)
                yield p, CompletionOutput(
                    index=k, text="", token_ids=tokens, finish_reason=finish_reason,
                    stop_reason=stop_reason, logprobs=logprobs, delta_text=delta)

    def _sample(self, state: RequestState, k: int):
        """Sample k's (token ids, logprobs or None, finish reason, stop reason) as the client
        sees them: with echo_only, no token and "length" once the engine's one step is done."""
        logprobs = state.logprobs[k] if self.params.logprobs is not None else None
        finish_reason, stop_reason = state.finish_reasons[k], state.stop_reasons[k]
        if not self.echo_only:
            return state.token_ids[k], logprobs, finish_reason, stop_reason
        if finish_reason in ("stop", "length"):  # (whether or not the token was a stop)
            finish_reason, stop_reason = "length", None
        return [], None if logprobs is None else [], finish_reason, stop_reason

    def final_outputs(self) -> list[RequestOutput]:
        """Every prompt's finished RequestOutput (the text detokenized here, once; `prompt`
        the echoed text, if any, and the prompt logprobs, if asked)."""
        finals = []
        for p, state in enumerate(self.states):
            outs = []
            for k in range(state.n):
                tokens, logprobs, finish_reason, stop_reason = self._sample(state, k)
                text = ""
                detokenizer = self.detokenizers[p][k]
                if detokenizer is not None:
                    if not self.stream:
                        detokenizer.update(tokens, _stop_terminated(finish_reason, stop_reason))
                    detokenizer.get_delta(True)
                    text = detokenizer.output_text
                outs.append(CompletionOutput(
                    index=k, text=text, token_ids=tokens, finish_reason=finish_reason,
                    stop_reason=stop_reason, logprobs=logprobs))
            finals.append(RequestOutput(
                state.request_id, None if self.echo is None else self.echo[p],
                state.prompt_token_ids, outs, finished=True,
                prompt_logprobs=state.prompt_logprobs))
        return finals

    def _abort_unfinished(self) -> None:
        self.client.abort([s.request_id for s in self.states])

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                self._abort_unfinished()
                self.gone = True
                self.run.wake.set()
                return


class OpenAIServer:
    """Turns validated bodies into engine requests and engine outputs into OpenAI responses."""

    def __init__(self, client: EngineCoreClient, tokenizer, served_model_name: str,
                 max_prompts_per_request: int = HttpOptions.max_prompts_per_request,
                 trust_request_chat_template: bool = False) -> None:
        self.trust_request_chat_template = trust_request_chat_template
        self.client, self.tokenizer = client, tokenizer
        self.limits = client.info.limits
        self.served_model_name = served_model_name
        self.prompt_input = PromptInput(tokenizer, self.limits, max_prompts_per_request)
        self.builder = ResponseBuilder(tokenizer, served_model_name)
        self.shutting_down = False

    @property
    def healthy(self) -> bool:
        return self.client.alive and not self.shutting_down

    # ------------------------------------------------------------ checks
    def check_available(self) -> None:
        if not self.client.alive:
            raise APIError(503, "the engine core process is not running")
        if self.shutting_down:
            raise APIError(503, "the server is shutting down")

    async def parse(self, request: Request, model_cls):
        self.check_available()
        try:
            body = model_cls.model_validate_json(await request.body())
        except ValidationError as e:
            raise api_error_from_validation(e) from None
        if body.model is not None and body.model != self.served_model_name:
            raise APIError(404, f"the model {short_text(body.model)!r} does not exist; this "
                           f"server serves {self.served_model_name!r}", param="model",
                           code="model_not_found")
        return body

    def _check_count(self, num_prompts: int, params: SamplingParams) -> None:
        max_num_seqs = self.limits.max_num_seqs
        if params.n > max_num_seqs:
            raise APIError(400, f"n={params.n} exceeds max_num_seqs={max_num_seqs}; ask for "
                           "fewer samples or start the server with a larger --max-num-seqs",
                           param="n")
        self.prompt_input.check_count(num_prompts, params.n)

    def _resolve_bad_words(self, params: SamplingParams, field: str) -> SamplingParams:
        """bad_words as token ids, with this process's tokenizer (the engine core gets them so);
        APIError(400) naming bad_words for a word that gives no token or a model without a
        tokenizer."""
        try:
            return resolve_bad_words(params, self.tokenizer)
        except ValueError as e:
            raise api_error_from_value_error(e, field) from None

    def _validate(self, prompts: list[list[int]], params: SamplingParams, field: str,
                  echo_only: bool = False) -> None:
        """Each prompt against the engine's limits (`validate_prompt`, echo_only worded for
        max_tokens=0); APIError(400) naming the field and, in a batch, which prompt."""
        for i, token_ids in enumerate(prompts):
            try:
                validate_prompt(token_ids, params, self.limits, echo_only=echo_only)
            except ValueError as e:
                error = api_error_from_value_error(e, field)
                if len(prompts) > 1:
                    error.message = f"{field}[{i}]: {error.message}"
                raise error from None

    # ------------------------------------------------------------ endpoints
    async def completions(self, request: Request) -> Response:
        arrival_time = time.monotonic()
        body: CompletionRequest = await self.parse(request, CompletionRequest)
        if body.suffix:
            raise APIError(400, "suffix is not supported", param="suffix", code=UNSUPPORTED)
        prompt = body.prompt
        max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's default
        echo_only = max_tokens == 0
        if echo_only:
            _check_echo_only(body)
            max_tokens = 1  # the engine's one step; _Run leaves its token out
        try:
            params = body.to_sampling_params(max_tokens, body.logprobs)
        except ValueError as e:
            raise api_error_from_value_error(e, "prompt") from None
        _check_prompt_logprobs(body)
        if body.echo and body.logprobs is not None:  # the echoed tokens' logprobs
            params = dataclasses.replace(
                params, prompt_logprobs=max(body.logprobs, params.prompt_logprobs or 0))
        if not prompt:
            raise APIError(400, "prompt is empty; give at least one token", param="prompt")
        one = isinstance(prompt, str) or isinstance(prompt[0], int)
        self._check_count(1 if one else len(prompt), params)
        if isinstance(prompt, str):
            prompts = await self.prompt_input.encode([prompt], "prompt", body.add_special_tokens)
        elif isinstance(prompt[0], str):
            prompts = await self.prompt_input.encode(prompt, "prompt", body.add_special_tokens)
        elif isinstance(prompt[0], int):
            prompts = [list(prompt)]
        else:
            prompts = [list(p) for p in prompt]
        untruncated = prompts
        try:
            prompts = [truncate_prompt(p, params.truncate_prompt_tokens, params.max_tokens,
                                       self.limits) for p in prompts]
        except ValueError as e:
            raise api_error_from_value_error(e, "truncate_prompt_tokens") from None
        params = self._resolve_bad_words(params, "prompt")
        self._validate(prompts, params, "prompt", echo_only)
        echo = None
        if body.echo:  # the prompt's text as sent; token ids (and truncated prompts) decoded
            if isinstance(prompt, str):
                echo = [prompt]
            elif isinstance(prompt[0], str):
                echo = list(prompt)
            else:
                echo = [self._decode(ids) for ids in prompts]
            echo = [text if kept is whole else self._decode(kept)
                    for text, kept, whole in zip(echo, prompts, untruncated)]
        return await self._respond(request, "completion", body, prompts, params, arrival_time,
                                   echo, echo_only)

    def _decode(self, token_ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(token_ids)

    async def chat_completions(self, request: Request) -> Response:
        arrival_time = time.monotonic()
        body: ChatCompletionRequest = await self.parse(request, ChatCompletionRequest)
        prompts = [await self._chat_prompt(body)]
        max_tokens = body.max_completion_tokens
        if max_tokens is None:
            max_tokens = body.max_tokens
        if body.truncate_prompt_tokens is not None:  # (before the default max_tokens below)
            try:
                check_truncate_prompt_tokens(body.truncate_prompt_tokens)
                prompts = [truncate_prompt(prompts[0], body.truncate_prompt_tokens, max_tokens,
                                           self.limits)]
            except ValueError as e:
                raise api_error_from_value_error(e, "messages") from None
        if max_tokens is None:  # as much as fits (OpenAI's default for chat)
            max_tokens = max_tokens_that_fit(len(prompts[0]), self.limits)
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
            # SamplingParams' names for what the chat request calls otherwise
            sent = {"logprobs": "top_logprobs"}
            if body.max_completion_tokens is not None:
                sent["max_tokens"] = "max_completion_tokens"
            if error.param in sent:
                error.message = error.message.replace(f"{error.param}=", f"{sent[error.param]}=",
                                                      1)
                error.param = sent[error.param]
            raise error from None
        _check_prompt_logprobs(body)
        self._check_count(1, params)
        params = self._resolve_bad_words(params, "messages")
        try:
            self._validate(prompts, params, "messages")
        except APIError as error:  # the length errors name the field the client sent
            if body.max_completion_tokens is not None:
                error.message = error.message.replace("max_tokens", "max_completion_tokens")
            raise
        return await self._respond(request, "chat", body, prompts, params, arrival_time)

    async def _chat_prompt(self, body: ChatCompletionRequest | TokenizeRequest) -> list[int]:
        """The token ids of a chat (`ChatMessage`s) through the model's chat template or the
        request's `chat_template`, with its chat_template_kwargs, documents, add_generation_prompt
        (default true) and continue_final_message (chat_template.render_chat's rule, which
        LLM.chat shares), as /v1/chat/completions and /tokenize make them; APIError(400)
        naming the field for no messages, no template, a template that fails, a bad
        combination of those fields, or a text too long.

        Too long, before rendering: the messages' contents together over
        `PromptInput.check_length`'s bound (max_model_len x the longest token's characters),
        a cheap refusal of a chat that cannot fit. It counts the contents only, the text chat
        templates render (Qwen3's leaves out a `<think>` block written into an earlier
        assistant content, so such a chat can be refused here by that block's characters).
        An assistant's reasoning and the documents are not counted: a template may leave them
        out (Qwen3's and DeepSeek-R1's drop the reasoning of earlier turns; a template without
        RAG support ignores documents), so counting them could refuse a chat that fits. After
        rendering, the text (whatever it took in) is held to the same bound, and on the chat
        endpoint its tokens to max_model_len (`validate_prompt`)."""
        messages = body.messages
        if not messages:
            raise APIError(400, "messages is empty; give at least one message", param="messages")
        tok = self.tokenizer
        if tok is None:
            raise APIError(400, "this model has no tokenizer, so no chat template; use "
                           "/v1/completions with token ids", param="messages")
        if body.chat_template is not None and not self.trust_request_chat_template:
            raise APIError(400, "a request's chat_template runs only on a server started with "
                           "--trust-request-chat-template (it is client-supplied Jinja); "
                           "leave chat_template out to use the model's template",
                           param="chat_template")
        if body.chat_template is None and not getattr(tok, "chat_template", None):
            raise APIError(400, "this model has no chat template; use /v1/completions or "
                           "send chat_template", param="messages")
        conversation = [m.to_template_dict() for m in messages]
        self.prompt_input.check_length(sum(len(m["content"]) for m in conversation), "messages")
        try:
            text = render_chat(
                tok, conversation, add_generation_prompt=body.add_generation_prompt is not False,
                continue_final_message=bool(body.continue_final_message),
                chat_template=body.chat_template, chat_template_kwargs=body.chat_template_kwargs,
                documents=body.documents)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param=e.param) from None
        # (the template writes its own special tokens: none added unless asked, as in vLLM)
        return (await self.prompt_input.encode([text], "messages",
                                               bool(body.add_special_tokens)))[0]

    async def tokenize(self, request: Request) -> Response:
        """POST /tokenize: {"tokens", "count", "max_model_len"} for a prompt or a chat, in this
        process (no engine round trip)."""
        body: TokenizeRequest = await self.parse(request, TokenizeRequest)
        if body.messages is not None:
            tokens = await self._chat_prompt(body)
        else:
            tokens = (await self.prompt_input.encode([body.prompt], "prompt",
                                                     body.add_special_tokens,
                                                     allow_empty=True))[0]
        response = {"tokens": tokens, "count": len(tokens),
                    "max_model_len": self.limits.max_model_len}
        if body.return_token_strs:
            response["token_strs"] = self.tokenizer.convert_ids_to_tokens(tokens)
        return JSONResponse(response)

    async def detokenize(self, request: Request) -> Response:
        """POST /detokenize: {"prompt": text} of token ids within the vocabulary (special
        tokens kept, as the tokenizer decodes them; no ids: "")."""
        body: DetokenizeRequest = await self.parse(request, DetokenizeRequest)
        tokens, vocab = body.tokens, self.limits.vocab_size
        if tokens and (min(tokens) < 0 or max(tokens) >= vocab):
            i = next(i for i, t in enumerate(tokens) if not 0 <= t < vocab)
            raise APIError(400, f"tokens[{i}]={short_text(str(tokens[i]))} is not a token id of "
                           f"the vocabulary [0, {vocab})", param="tokens")
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer", param="tokens")
        if len(tokens) <= INLINE_TOKENS:
            text = self.tokenizer.decode(tokens)
        else:  # (a long list on a worker thread: the event loop keeps answering)
            text = await asyncio.to_thread(self.tokenizer.decode, tokens)
        return JSONResponse({"prompt": text})

    # ------------------------------------------------------------ responses
    async def _respond(self, request: Request, kind: str, body, prompts: list[list[int]],
                       params: SamplingParams, arrival_time: float,
                       echo: list[str] | None = None, echo_only: bool = False) -> Response:
        base_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        builder = self.builder.for_request(body.return_tokens_as_token_ids)
        run = _Run(self.client, self.tokenizer, request, base_id, prompts, params,
                   arrival_time, stream=bool(body.stream), echo=echo, echo_only=echo_only)
        num_top = params.logprobs or 0
        if body.stream:
            return StreamingResponse(self._stream(run, kind, base_id, body.include_usage,
                                                  num_top, builder,
                                                  bool(body.return_token_ids),
                                                  body.continuous_usage_stats),
                                     media_type="text/event-stream", headers=_SSE_HEADERS)
        async with run:
            while not run.finished:
                await run.wait()
                if run.gone:  # the client is gone; nobody reads this
                    return Response(status_code=499)
        return JSONResponse(builder.full_response(
            kind, base_id, run.final_outputs(), params.n, echo=echo is not None,
            num_top=num_top, prompt_logprobs=body.prompt_logprobs,
            token_ids=bool(body.return_token_ids)))

    async def _stream(self, run: _Run, kind: str, base_id: str, include_usage: bool,
                      num_top: int, builder: ResponseBuilder, token_ids: bool = False,
                      continuous_usage: bool = False):
        """Server-sent events; requests are added only once the response streams, so a client
        that leaves before the first byte never starts one. Each wake-up sends everything that
        arrived since the last one, in one write. With echo, each choice's first chunk leads
        with its prompt (and the prompt's logprobs, num_top per token, where asked). builder:
        the request's (`ResponseBuilder.for_request`). token_ids (vLLM's return_token_ids):
        the chunks carry token ids; continuous_usage (vLLM's
        stream_options.continuous_usage_stats, with include_usage): every chunk with a choice
        carries that choice's usage so far (response.py, `StreamState`)."""
        echo = None if run.echo is None else list(zip(run.echo, run.prompts))
        usage_prompt_tokens = [len(p) for p in run.prompts] if continuous_usage else None
        stream: StreamState = builder.stream(kind, base_id, run.params.n, len(run.prompts),
                                             echo, num_top,
                                             run.prompts if token_ids else None,
                                             usage_prompt_tokens)
        try:
            async with run:
                pieces = [_sse(chunk) for chunk in stream.start()]
                while True:
                    # everything up to `done` is sent below, also what arrived while an
                    # earlier write waited on the client
                    done = run.finished
                    for p, out in run.new_outputs():
                        fast = stream.text_sse(p, out)
                        if fast is not None:
                            pieces.append(fast)
                        else:
                            pieces += [_sse(chunk) for chunk in stream.update_one(
                                p, out, run.states[p].prompt_logprobs)]
                    if pieces:
                        yield "".join(pieces)
                        pieces = []
                    if done:
                        break
                    await run.wait()
                    if run.gone:
                        return
            if include_usage:
                yield _sse(stream.usage_chunk(run.final_outputs()))
        except APIError as e:
            yield _sse(e.body())
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------ shutdown
    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; wait up to timeout_s for open requests, then fail the rest."""
        self.shutting_down = True
        deadline = time.monotonic() + timeout_s
        while self.client.states and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for state in list(self.client.states.values()):
            state.run.fail(503, "the server is shutting down")
        self.client.abort(list(self.client.states))


def _check_echo_only(body: CompletionRequest) -> None:
    """max_tokens=0 on completions: echo=true without generation (the prompt's text, and with
    logprobs its tokens' logprobs: scoring), as in OpenAI's legacy completions and vLLM. With n
    > 1 every choice is the same echo. Not without echo, with min_tokens or with beam search."""
    if not body.echo:
        raise APIError(400, "max_tokens=0 must be >= 1; 0 goes only with echo=true (the prompt "
                       "echoed, and scored with logprobs, with nothing generated)",
                       param="max_tokens")
    if body.min_tokens:
        raise APIError(400, f"min_tokens={short_repr(body.min_tokens)} exceeds max_tokens=0",
                       param="min_tokens")
    if body.use_beam_search:
        raise APIError(400, "max_tokens=0 (echo=true without generation) does not go with "
                       "use_beam_search=true: there is nothing to search",
                       param="use_beam_search")


def _check_prompt_logprobs(body) -> None:
    """prompt_logprobs is for whole responses only (vLLM refuses it on streams too)."""
    if body.stream and body.prompt_logprobs is not None:
        raise APIError(400, f"prompt_logprobs={short_repr(body.prompt_logprobs)} is not "
                       "available with stream=true; ask without streaming (echo=true with "
                       "logprobs gives the prompt tokens' logprobs on a completions stream)",
                       param="prompt_logprobs")


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status_code)


def build_app(client: EngineCoreClient, tokenizer, served_model_name: str,
              options: HttpOptions | None = None) -> FastAPI:
    """The FastAPI app behind the guards of `options` (guards.py); its lifespan connects to
    the engine core and disconnects. With an API key, /docs, /redoc and /openapi.json are off."""
    options = HttpOptions() if options is None else options
    metrics = ServerMetrics()
    client.metrics = metrics
    metrics.bind(client.snapshot)
    server = OpenAIServer(client, tokenizer, served_model_name, options.max_prompts_per_request,
                          options.trust_request_chat_template)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await client.start()
        try:
            yield
        finally:
            await client.close()

    no_docs = {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="pagedrt", lifespan=lifespan, **(no_docs if options.api_key else {}))
    app.state.server = server
    install_guards(app, options)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = str(e.detail)
        headers = dict(e.headers or {})
        if e.status_code in (404, 405):  # name what was asked for (cut: no long echoes)
            message += f": {request.method} {short_text(request.url.path)}"
            if headers.get("Allow"):
                message += f"; this path takes {headers['Allow']}"
        response = _error_response(APIError(e.status_code, message))
        response.headers.update(headers)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return _error_response(APIError(400, str(e.errors())))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return _error_response(APIError(500, f"internal error: {e!r}"))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if server.healthy else 503)

    @app.get("/version")
    async def version() -> JSONResponse:  # (vLLM's path and body)
        from pagedrt import __version__

        return JSONResponse({"version": __version__})

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {"id": served_model_name, "object": "model", "created": int(time.time()),
                "owned_by": "pagedrt", "root": served_model_name,  # no file system paths
                "max_model_len": client.info.limits.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    app.post("/v1/completions")(server.completions)
    app.post("/v1/chat/completions")(server.chat_completions)
    app.post("/tokenize")(server.tokenize)
    app.post("/detokenize")(server.detokenize)
    return app


def default_model_name(path: str) -> str:
    """"SmolLM2-135M-Instruct" for .../SmolLM2-135M-Instruct.Q4_1.gguf; a folder's name."""
    name = os.path.basename(os.path.normpath(path))
    if name.endswith(".gguf"):
        name = name[: -len(".gguf")]
        stem, dot, quant = name.rpartition(".")
        name = stem if dot and quant[:1] in "QFIB" else name
    return name
