"""AsyncEngine: one background thread owns the `LLMEngine`; asyncio handlers talk to it by queues.

    HTTP handlers (event loop thread)             engine thread
    ---------------------------------             -------------
    add_request / abort --> commands (SimpleQueue) --> applied between two steps
                                                      engine.step()
    asyncio.Queue per HTTP request <-- call_soon_threadsafe -- RequestOutput (or an exception)

The engine is not thread-safe, so nothing but this thread calls it; handlers read only
`AsyncEngine.stats`, a snapshot the thread replaces as a whole. An abort is applied before the
next step begins, so a disconnected client costs at most the step in flight. The loop sleeps on
an Event while the engine has nothing to do; every command sets it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass

from pagedrt.engine.llm_engine import LLMEngine
from pagedrt.entrypoints.metrics import ServerMetrics
from pagedrt.outputs import RequestOutput
from pagedrt.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Seconds between two stats snapshots while busy (always refreshed when the engine goes idle).
_STATS_INTERVAL_S = 0.05


@dataclass
class _Tracked:
    """An admitted request, as the engine thread sees it."""

    loop: asyncio.AbstractEventLoop
    sink: asyncio.Queue  # receives RequestOutput, or an exception that ends the request
    arrival_time: float  # time.monotonic() when the HTTP request arrived
    num_samples: int = 1
    stream: bool = True  # False: the engine reports the request only once it has finished
    last_token_time: float | None = None
    num_output_tokens: int = 0


class AsyncEngine:
    """Runs `engine` in a daemon thread; `start()` once, `shutdown()` at exit."""

    def __init__(self, engine: LLMEngine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._num_prompt_tokens = 0
        self._num_finished: dict[str, int] = {}
        self._last_stats_time = 0.0
        self.stats: dict = self._snapshot()
        self._thread = threading.Thread(target=self._run, name="pagedrt-engine", daemon=True)

    # ------------------------------------------------------------ any thread
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    sink: asyncio.Queue, arrival_time: float, stream: bool = True) -> None:
        """Queue a request (validate it first: errors here reach `sink`). Event loop thread.

        stream=False: only the finished output is delivered (the engine then skips per-step
        detokenization).
        """
        tracked = _Tracked(asyncio.get_running_loop(), sink, arrival_time, params.n, stream)
        self._commands.put(("add", request_id, prompt_token_ids, params, tracked))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks before the next step; unknown ids are ignored."""
        self._commands.put(("abort", request_id))
        self._wake.set()

    # ------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while not self._stop:
            self._apply_commands()
            if not self.engine.has_unfinished_requests():
                self.stats = self._snapshot()
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # keep serving: fail the requests in flight, free their blocks
                logger.exception("engine step failed; aborting %d requests", len(self._tracked))
                self._fail_all(e)
                continue
            self._deliver_outputs(outputs)
            now = time.monotonic()
            if now - self._last_stats_time > _STATS_INTERVAL_S:
                self.stats = self._snapshot()

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, prompt_token_ids, params, tracked = command
                try:
                    self.engine.add_request(request_id, prompt_token_ids, params,
                                            stream=tracked.stream)
                except Exception as e:  # noqa: BLE001 - handed to the caller; loop stays alive
                    self._send(tracked, e)
                    continue
                self._tracked[request_id] = tracked
                self._num_prompt_tokens += len(prompt_token_ids)
            else:
                request_id = command[1]
                tracked = self._tracked.pop(request_id, None)
                if tracked is not None:
                    self.engine.abort_request(request_id)
                    self._count_finished("abort", tracked.num_samples)

    def _deliver_outputs(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:
                continue
            if self.metrics is not None:
                self._observe_latencies(tracked, out, now)
            if out.finished:
                del self._tracked[out.request_id]
                if self.metrics is not None:
                    self.metrics.e2e_request_latency.observe(now - tracked.arrival_time)
                for o in out.outputs:
                    self._count_finished(o.finish_reason or "abort")
            self._send(tracked, out)

    def _observe_latencies(self, tracked: _Tracked, out: RequestOutput, now: float) -> None:
        """TTFT and inter-token latency. A streamed request is seen at every step; a
        non-streamed one only at its end, so its mean token gap stands for each of its gaps."""
        m = self.metrics
        num_tokens = sum(len(o.token_ids) for o in out.outputs)
        first = out.metrics.get("first_token_time")
        if tracked.stream:
            if num_tokens > tracked.num_output_tokens:
                if tracked.last_token_time is None:
                    m.time_to_first_token.observe((first or now) - tracked.arrival_time)
                else:
                    m.inter_token_latency.observe(now - tracked.last_token_time)
                tracked.last_token_time = now
            tracked.num_output_tokens = num_tokens
        elif out.finished and first is not None:
            m.time_to_first_token.observe(first - tracked.arrival_time)
            num_gaps = len(out.outputs[0].token_ids) - 1
            last = out.metrics.get("last_token_time") or first
            for _ in range(max(0, num_gaps)):
                m.inter_token_latency.observe((last - first) / num_gaps)

    def _fail_all(self, error: Exception) -> None:
        for request_id, tracked in list(self._tracked.items()):
            try:
                self.engine.abort_request(request_id)
            except Exception:
                logger.exception("abort of %s failed", request_id)
            self._send(tracked, RuntimeError(f"engine step failed: {error!r}"))
        self._tracked.clear()

    @staticmethod
    def _send(tracked: _Tracked, item) -> None:
        try:
            tracked.loop.call_soon_threadsafe(tracked.sink.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    def _count_finished(self, reason: str, num_samples: int = 1) -> None:
        self._num_finished[reason] = self._num_finished.get(reason, 0) + num_samples

    def _snapshot(self) -> dict:
        stats = self.engine.stats()
        stats["server_prompt_tokens"] = self._num_prompt_tokens
        stats["server_finished"] = dict(self._num_finished)
        self._last_stats_time = time.monotonic()
        return stats
