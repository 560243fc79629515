"""HTTP guards of `pagedrt serve`'s API process: checks made before any handler runs.

    client -> uvicorn (HeaderTimeoutProtocol: headers within read_timeout_s, at most
              MAX_HEADER_BYTES)
           -> HostGuard            Host header in allowed_hosts (DNS rebinding)       400
           -> CORSMiddleware       only with allowed_origins (Starlette's)
           -> ApiKeyGuard          with an API key: every path but /health            401
           -> BodyGuard            POST bodies: application/json only                  415
                                   at most max_request_bytes (Content-Length, and
                                   counted while a chunked body arrives)               413
                                   whole within read_timeout_s                         408
                                   a client gone mid-upload: nothing sent, one
                                   debug log line
           -> FastAPI app (openai_server.py)

Every refusal has OpenAI's error body ({"error": {"message", "type", "param", "code"}}) and
`Connection: close`, so a client cannot go on streaming a refused body into the connection.
BodyGuard reads the whole body before the app runs and hands it on in one message; the app's
later `receive()` calls (waiting for a disconnect) go to the client's connection as before.

Uvicorn has no timeout for a request's headers (its `timeout_keep_alive` runs only between
requests, and httptools puts no bound on header size): `HeaderTimeoutProtocol`, a small
subclass of its httptools protocol, closes a connection whose headers take longer than
read_timeout_s or exceed MAX_HEADER_BYTES. Bodies are timed here, in BodyGuard, so that a slow
body gets a 408 answer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pagedrt.entrypoints.protocol import APIError

logger = logging.getLogger(__name__)

# Request headers (request line included) larger than this close the connection.
MAX_HEADER_BYTES = 64 * 1024
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# Paths that never need the API key (a load balancer's health check has no key).
PUBLIC_PATHS = frozenset({"/health"})


@dataclass(frozen=True)
class HttpOptions:
    """The serve options of the HTTP layer (plain data: pickled to each API process).

    Attributes:
        allowed_hosts: Host header values accepted (any port), as Starlette's
            TrustedHostMiddleware matches them ("example.com", "*.example.com", "[::1]");
            ("*",) accepts any.
        allowed_origins: origins that browsers may call from (CORS); () turns CORS off.
        api_key: when set, every path but /health needs `Authorization: Bearer KEY`.
        max_request_bytes: largest request body, in bytes.
        read_timeout_s: seconds a client has to send a request's headers, and again its body.
        shutdown_timeout_s: seconds open requests get to finish after SIGTERM.
        max_prompts_per_request: most sequences (prompts x n) in one request.
        trust_request_chat_template: run a request's own `chat_template` (client-supplied
            Jinja, rendered in the API process); off by default, as vLLM's
            --trust-request-chat-template: such a request is then a 400.
    """

    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    allowed_origins: tuple[str, ...] = ()
    api_key: str | None = None
    max_request_bytes: int = 8 * 1024 * 1024
    read_timeout_s: float = 30.0
    shutdown_timeout_s: float = 4.0
    max_prompts_per_request: int = 256
    trust_request_chat_template: bool = False

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_prompts_per_request"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')}={value} must be >= 1")
        if not (math.isfinite(self.read_timeout_s) and self.read_timeout_s > 0):
            raise ValueError(f"--read-timeout={self.read_timeout_s} must be a number > 0")
        if not (math.isfinite(self.shutdown_timeout_s) and self.shutdown_timeout_s >= 0):
            raise ValueError(f"--shutdown-timeout={self.shutdown_timeout_s} must be a number "
                             ">= 0 (0 ends open streams at once)")
        for pattern in self.allowed_hosts:
            if "*" in pattern[1:] or (pattern.startswith("*") and pattern != "*"
                                      and not pattern.startswith("*.")):
                raise ValueError(f"--allowed-hosts entry {pattern!r}: a wildcard must be "
                                 "'*' or lead a domain ('*.example.com')")


def install_guards(app, options: HttpOptions) -> None:
    """Add the guards to a Starlette/FastAPI app, outermost first: Host, CORS (only with
    allowed_origins), API key (only with a key), body."""
    app.add_middleware(BodyGuard, max_bytes=options.max_request_bytes,
                       timeout_s=options.read_timeout_s)
    if options.api_key is not None:
        app.add_middleware(ApiKeyGuard, api_key=options.api_key)
    if options.allowed_origins:  # outside the key check: a preflight carries no key
        app.add_middleware(CORSMiddleware, allow_origins=list(options.allowed_origins),
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(HostGuard, allowed_hosts=options.allowed_hosts)


def default_allowed_hosts(host: str) -> tuple[str, ...]:
    """What `--host` implies: the loopback names for a loopback address (or 'localhost'),
    anything ("*") for any other address (set --allowed-hosts to narrow it)."""
    if host == "localhost":
        return LOOPBACK_HOSTS
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    return LOOPBACK_HOSTS if loopback else ("*",)


async def send_error(send: Send, status: int, message: str, **fields) -> None:
    """A whole JSON error response in OpenAI's shape (`APIError`'s body; fields: its type,
    param and code), with `Connection: close`."""
    body = json.dumps(APIError(status, message, **fields).body(), separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _short(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class HostGuard:
    """400 unless the Host header is allowed. The matching is Starlette's
    TrustedHostMiddleware's (any port; "*.example.com" wildcards); only its plain-text
    rejection is replaced by an OpenAI-style JSON body."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.allow_any = "*" in allowed_hosts
        self._match = TrustedHostMiddleware(self._accept, allowed_hosts=list(allowed_hosts),
                                            www_redirect=False)

    @staticmethod
    async def _accept(scope: Scope, receive: Receive, send: Send) -> None:
        scope["pagedrt.host_ok"] = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allow_any or scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def discard(message: Message) -> None:  # TrustedHostMiddleware's 400
            pass

        await self._match(scope, receive, discard)
        if scope.pop("pagedrt.host_ok", False):
            await self.app(scope, receive, send)
            return
        host = _short(_header(scope, b"host") or "")
        await send_error(send, 400, f"Host header {host!r} is not allowed; start the server "
                         "with --allowed-hosts naming it (or '*' for any)", param="host",
                         code="invalid_host")


class ApiKeyGuard:
    """401 unless `Authorization: Bearer KEY` (compared in constant time); /health is open."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        scheme, _, token = (_header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                token.strip().encode("latin-1"), self.key):
            await send_error(send, 401, "missing or incorrect API key; send 'Authorization: "
                             "Bearer KEY'", type="authentication_error", code="invalid_api_key")
            return
        await self.app(scope, receive, send)


class BodyGuard:
    """POST bodies: JSON only (415), at most max_bytes (413), complete within timeout_s (408).

    The body is read here, whole, before the app runs; the app receives it as one message.
    A client that disconnects mid-upload ends the request quietly (no response, no 5xx).
    Requests of other methods pass unchanged (no route of this server reads their body).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            shown = _short(content_type) if content_type else "none"
            await send_error(send, 415, f"Content-Type {shown!r} is not supported; send the "
                             "body as JSON with 'Content-Type: application/json'",
                             code="unsupported_media_type")
            return
        too_large = (f"request body exceeds --max-request-bytes={self.max_bytes} bytes; send "
                     "a smaller request (fewer or shorter prompts)")
        length = _header(scope, b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            await send_error(send, 413, too_large, code="request_too_large")
            return
        chunks, size = [], 0
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except (asyncio.TimeoutError, TimeoutError):
                await send_error(send, 408, f"request body not received within "
                                 f"--read-timeout={self.timeout_s:g} s", code="request_timeout")
                return
            if message["type"] == "http.disconnect":
                logger.debug("client disconnected during the upload of %s", scope["path"])
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_error(send, 413, too_large, code="request_too_large")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol, but a request's headers must arrive within
    `read_timeout_s` (from the connection's start, or from the request's first byte) and
    within MAX_HEADER_BYTES, else the connection is closed. Set `read_timeout_s` on the class
    (`configured(...)`) before uvicorn builds it."""

    read_timeout_s = 30.0

    @classmethod
    def configured(cls, read_timeout_s: float) -> type[HeaderTimeoutProtocol]:
        return type("HeaderTimeoutProtocol", (cls,), {"read_timeout_s": read_timeout_s})

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_bytes = 0
        self._in_headers = True
        self._header_timer = self.loop.call_later(self.read_timeout_s, self._headers_late)

    def data_received(self, data: bytes) -> None:
        if self._in_headers and self._header_bytes + len(data) > MAX_HEADER_BYTES:
            room = MAX_HEADER_BYTES - self._header_bytes
            super().data_received(data[:room])  # may complete the headers (the rest: body)
            if self._in_headers:
                logger.info("closing a connection whose headers exceed %d bytes",
                            MAX_HEADER_BYTES)
                self._close()
            if self.transport.is_closing():
                return
            data = data[room:]
        if self._in_headers:
            self._header_bytes += len(data)
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_headers:  # the next request on a kept-alive connection
            self._in_headers = True
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(self.read_timeout_s, self._headers_late)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._header_timer.cancel()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._header_timer.cancel()
        super().connection_lost(exc)

    def _headers_late(self) -> None:
        if self._in_headers:
            logger.info("closing a connection whose headers took over %g s", self.read_timeout_s)
            self._close()

    def _close(self) -> None:
        self._in_headers = False
        self._header_timer.cancel()
        if not self.transport.is_closing():
            self.transport.close()
