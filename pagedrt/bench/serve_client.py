"""The HTTP side of `pagedrt bench serve`: send timed requests to an OpenAI-compatible server.

One event loop (asyncio + aiohttp, on uvloop where installed) sends its requests at their
arrival offsets, at most
`max_concurrency` at a time, and records per request the time to the first output chunk
(TTFT), every gap between output chunks (ITL), the end-to-end latency and the output token
count. With several client processes (multiprocessing, spawn) each runs its own loop over its
share of the schedule, all released at once, and their records are merged.

Server-sent events are parsed as the WHATWG HTML "server-sent events" section defines them:
lines end in LF, CRLF or CR; a blank line ends an event; `data:` lines (one leading space
dropped) are joined with LF; lines starting with `:` are comments; other fields are ignored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import queue as queue_module
import time
from collections.abc import Callable


class SSEParser:
    """Incremental server-sent-events parser: feed() bytes as they arrive, in pieces split
    anywhere (inside a line, a CRLF pair or a UTF-8 character), get the data of each
    completed event."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._pending_cr = False  # the last byte fed was CR: an LF right after belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        """The data payloads of the events that `chunk` completes, in order."""
        if not chunk:
            return []
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._pending_cr = chunk.endswith(b"\r")
        buffer = self._buffer + chunk
        lines = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buffer = lines.pop()  # no line end yet (b"" after a complete line)
        events = []
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if field == "data":
                self._data.append(value.removeprefix(" "))
        return events


@dataclasses.dataclass
class RequestSpec:
    """One request of the workload. `prompt`: token ids (completions) or text (chat)."""

    index: int
    prompt: list[int] | str
    prompt_len: int  # tokens (planned; a chat prompt's count is the server's)
    output_len: int  # max_tokens asked for


@dataclasses.dataclass
class ClientConfig:
    """Where and how to send; `request_timeout_s` bounds each request from send to end."""

    url: str  # base URL + endpoint
    model: str
    chat: bool = False
    stream: bool = True
    api_key: str | None = None
    request_timeout_s: float = 600.0


@dataclasses.dataclass
class RequestRecord:
    """What one request measured; times in seconds. `start_s` and `end_s` count from the
    start of the schedule of the client process that sent it. `ttft_s` and `itl_s` need
    streaming (None and [] without)."""

    index: int
    prompt_len: int
    output_len: int
    start_s: float = 0.0
    end_s: float = 0.0
    success: bool = False
    error: str | None = None
    ttft_s: float | None = None
    itl_s: list[float] = dataclasses.field(default_factory=list)
    e2el_s: float | None = None
    output_tokens: int = 0
    output_tokens_from: str = "none"  # "usage" (the server's count), "chunks" or "none"


def build_payload(spec: RequestSpec, cfg: ClientConfig) -> dict:
    """The JSON body: greedy, exactly output_len tokens (ignore_eos, a vLLM extension that
    pagedrt also accepts), streamed with a final usage chunk unless stream is off."""
    body: dict = {"model": cfg.model, "temperature": 0.0, "ignore_eos": True,
                  "stream": cfg.stream}
    if cfg.chat:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
        body["max_completion_tokens"] = spec.output_len
    else:
        body["prompt"] = spec.prompt
        body["max_tokens"] = spec.output_len
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _output_text(choice: dict, chat: bool) -> str:
    if chat:
        delta = choice.get("delta") or choice.get("message") or {}
        return (delta.get("content") or delta.get("reasoning_content")
                or delta.get("reasoning") or "")
    return choice.get("text") or ""


def carries_output(event: dict, chat: bool) -> bool:
    """Whether a stream chunk holds generated text or token ids (not just a role, a finish
    reason or usage)."""
    return any(_output_text(c, chat) or c.get("token_ids") for c in event.get("choices") or ())


def _error_text(event: dict) -> str:
    error = event["error"]
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _read_usage(record: RequestRecord, event: dict) -> None:
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.output_tokens_from = "usage"
        if usage.get("prompt_tokens") is not None:
            record.prompt_len = int(usage["prompt_tokens"])


async def _stream(session, spec: RequestSpec, cfg: ClientConfig, headers: dict,
                  record: RequestRecord, sent: float) -> None:
    async with session.post(cfg.url, json=build_payload(spec, cfg),
                            headers=headers) as response:
        if response.status != 200:
            record.error = _http_error(response.status, await response.read())
            return
        parser = SSEParser()
        last = None
        num_chunks = 0
        done = False
        async for piece in response.content.iter_any():
            now = time.perf_counter()
            for data in parser.feed(piece):
                if data.strip() == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    record.error = f"error event: {_error_text(event)}"[:500]
                    return
                if carries_output(event, cfg.chat):
                    if last is None:
                        record.ttft_s = now - sent
                    else:
                        record.itl_s.append(now - last)
                    last = now
                    num_chunks += 1
                _read_usage(record, event)
        if not done:
            record.error = "stream closed before data: [DONE]"
            return
        if record.output_tokens_from != "usage":
            record.output_tokens, record.output_tokens_from = num_chunks, "chunks"
        record.success = True


async def _whole(session, spec: RequestSpec, cfg: ClientConfig, headers: dict,
                 record: RequestRecord) -> None:
    async with session.post(cfg.url, json=build_payload(spec, cfg),
                            headers=headers) as response:
        content = await response.read()
    if response.status != 200:
        record.error = _http_error(response.status, content)
        return
    body = json.loads(content)
    if "error" in body:
        record.error = f"error body: {_error_text(body)}"[:500]
        return
    _read_usage(record, body)
    record.success = True


def _http_error(status: int, body: bytes) -> str:
    text = body.decode("utf-8", errors="replace")
    try:
        text = _error_text(json.loads(text))
    except (ValueError, KeyError, TypeError):
        pass
    return f"HTTP {status}: {text}"[:500]


async def send_request(client, spec: RequestSpec, cfg: ClientConfig, t0: float) -> RequestRecord:
    """Send one request and measure it. Never raises for a failed request: HTTP errors,
    error events, broken streams and timeouts become `record.error`."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    record = RequestRecord(spec.index, spec.prompt_len, spec.output_len)
    sent = time.perf_counter()
    record.start_s = sent - t0
    call = (_stream(client, spec, cfg, headers, record, sent) if cfg.stream
            else _whole(client, spec, cfg, headers, record))
    try:
        await asyncio.wait_for(call, timeout=cfg.request_timeout_s)
    except asyncio.TimeoutError:
        record.error = f"timed out after {cfg.request_timeout_s:g} s (--request-timeout)"
    except Exception as e:  # noqa: BLE001 - one failed request must not end the run; recorded
        record.error = f"{type(e).__name__}: {e}"[:500]
    end = time.perf_counter()
    record.end_s = end - t0
    if record.error is not None:
        record.success = False
    elif record.success:
        record.e2el_s = end - sent
    return record


async def run_schedule(specs: list[RequestSpec], offsets_s: list[float], cfg: ClientConfig,
                       max_concurrency: int | None,
                       wait_for_start: Callable[[], None] | None = None,
                       on_done: Callable[[RequestRecord], None] | None = None,
                       ) -> list[RequestRecord]:
    """Send specs[i] at offsets_s[i] seconds after the start (or later, once fewer than
    `max_concurrency` requests are in flight); the records in the order of `specs`.
    `wait_for_start` is called after the client is set up, just before the clock starts."""
    import aiohttp

    num_connections = min(max_concurrency or len(specs), len(specs)) or 1
    connector = aiohttp.TCPConnector(limit=num_connections)
    timeout = aiohttp.ClientTimeout(total=None)  # each request is bounded in send_request
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        async def one(spec: RequestSpec) -> RequestRecord:
            if semaphore is None:
                record = await send_request(client, spec, cfg, t0)
            else:
                async with semaphore:
                    record = await send_request(client, spec, cfg, t0)
            if on_done is not None:
                on_done(record)
            return record

        if wait_for_start is not None:
            wait_for_start()
        t0 = time.perf_counter()
        tasks = []
        for spec, offset in zip(specs, offsets_s):
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(spec)))
        return list(await asyncio.gather(*tasks))


def _run_loop(coro):
    """Run `coro` on a fresh event loop: uvloop's where it is installed (a pagedrt dependency
    on Linux and macOS), asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _raise_open_files_limit() -> None:
    """Each in-flight request holds a socket: lift the soft limit on open files to the hard
    one (Unix; elsewhere nothing to do)."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _client_process(rank: int, specs, offsets_s, cfg, max_concurrency, ready, go,
                    results, start_timeout_s: float) -> None:
    """Body of one spawned client process: set up, report ready, wait for the shared start,
    run its share, send back (rank, records as dicts)."""
    _raise_open_files_limit()

    def wait_for_start() -> None:
        ready.put(rank)
        if not go.wait(start_timeout_s):
            raise RuntimeError(f"client process {rank}: no start signal in {start_timeout_s} s")

    try:
        cpu0 = time.process_time()
        records = _run_loop(run_schedule(specs, offsets_s, cfg, max_concurrency,
                                         wait_for_start))
        cpu_s = time.process_time() - cpu0
        results.put((rank, [dataclasses.asdict(r) for r in records], cpu_s, None))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        results.put((rank, None, 0.0, f"{type(e).__name__}: {e}"))


def split_concurrency(max_concurrency: int | None, num_processes: int) -> list[int | None]:
    """Each process's share of the in-flight cap (None: no cap); shares differ by at most 1.
    Raises ValueError when there is no process or the cap is below the number of processes."""
    if num_processes < 1:
        raise ValueError(f"--num-client-processes {num_processes} must be >= 1")
    if max_concurrency is None:
        return [None] * num_processes
    if max_concurrency < num_processes:
        raise ValueError(f"--max-concurrency {max_concurrency} is below "
                         f"--num-client-processes {num_processes}; every process needs at "
                         "least one request in flight: raise the cap or use fewer processes")
    base, extra = divmod(max_concurrency, num_processes)
    return [base + (rank < extra) for rank in range(num_processes)]


def run_clients(specs: list[RequestSpec], offsets_s: list[float], cfg: ClientConfig,
                max_concurrency: int | None, num_processes: int = 1,
                progress: Callable[[RequestRecord], None] | None = None,
                ) -> tuple[list[RequestRecord], float]:
    """Run the schedule in this process (num_processes=1) or spread over spawned client
    processes: request i goes to process i % num_processes at its own offset, and the
    in-flight cap is split between them. Returns the records sorted by request index, and
    the CPU seconds the client processes spent (user + system, summed over processes; to
    show whether the client, not the server, limits a run). Ends by itself: every request is
    bounded by cfg.request_timeout_s."""
    caps = split_concurrency(max_concurrency, num_processes)
    if num_processes == 1:
        _raise_open_files_limit()
        cpu0 = time.process_time()
        records = _run_loop(run_schedule(specs, offsets_s, cfg, max_concurrency,
                                         on_done=progress))
        return records, time.process_time() - cpu0
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    start_timeout_s = 120.0
    processes = [
        ctx.Process(target=_client_process, daemon=True, name=f"bench-serve-client-{rank}",
                    args=(rank, specs[rank::num_processes], offsets_s[rank::num_processes],
                          cfg, caps[rank], ready, go, results, start_timeout_s))
        for rank in range(num_processes)]
    for p in processes:
        p.start()
    try:
        for _ in processes:
            _get(ready, processes, start_timeout_s, "to start")
        go.set()
        bound = (max(offsets_s, default=0.0) + cfg.request_timeout_s) * 2 + 60.0
        records: list[RequestRecord] = []
        cpu_s = 0.0
        for _ in processes:
            rank, rows, process_cpu_s, error = _get(results, processes, bound, "to finish")
            if error is not None:
                raise RuntimeError(f"client process {rank} failed: {error}")
            records.extend(RequestRecord(**row) for row in rows)
            cpu_s += process_cpu_s
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return sorted(records, key=lambda r: r.index), cpu_s


def _get(q, processes, timeout_s: float, what: str):
    """The next item of q; RuntimeError if a process died first or none came in timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=1.0)
        except queue_module.Empty:
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"client process {dead[0].name} exited with code "
                                   f"{dead[0].exitcode} before reporting") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"client processes took over {timeout_s:.0f} s {what}"
                                   ) from None
