"""The API process's side of the engine core (see engine_core.py and docs/design.md).

    HTTP handler                 EngineCoreClient (this process)           engine core
    ------------                 -------------------------------           -----------
    add(state) / abort(ids)  --> pickled Add / Abort, zmq PUSH       -->   (own process)
    await state.run.wake    <--  output task: CoreOutputs per step  <--   zmq PUSH
                                 appends each token to its RequestState and sets the
                                 handler's Event once per message

Coalescing: a RequestState accumulates tokens; a handler that wakes late (a slow client
holds its writes back) takes every token that arrived since, in one chunk. Nothing here ever
waits on a handler, so a stalled client delays no one.

Death of the core is seen on the liveness pipe (end of file): every open request fails at
once with a 503 error and `alive` turns False.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from pagedrt.entrypoints.engine_core import Abort, Add, CoreInfo, CoreOutputs
from pagedrt.entrypoints.metrics import ServerMetrics
from pagedrt.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class RequestRun:
    """The engine requests of one HTTP request: the handler waits on `wake` for any of them."""

    __slots__ = ("error", "error_status", "wake")

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.error_status = 0  # HTTP status of the first failure, 0 while none
        self.error = ""

    def fail(self, status: int, message: str) -> None:
        if not self.error_status:
            self.error_status, self.error = status, message
        self.wake.set()


class RequestState:
    """What the engine has produced for one prompt (its n samples), as tokens arrive.

    Attributes:
        token_ids, logprobs: per sample, every token (and TokenLogprobs) so far.
        prompt_logprobs: None first, then a TokenLogprobs per prompt token as they arrive
            (complete once the first token has: engine_core.CoreOutputs); None when the
            request did not ask (SamplingParams.prompt_logprobs).
        finish_reasons, stop_reasons: per sample, set when it finished.
        num_finished: samples finished.
        arrival_time: time.monotonic() when the HTTP request arrived.
        first_token_time, last_token_time: time.monotonic() of the first / latest tokens.
    """

    __slots__ = (
        "arrival_time",
        "finish_reasons",
        "first_token_time",
        "last_token_time",
        "logprobs",
        "n",
        "num_finished",
        "prompt_logprobs",
        "prompt_token_ids",
        "request_id",
        "run",
        "stop_reasons",
        "token_ids",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], n: int, run: RequestRun,
                 arrival_time: float, prompt_logprobs: bool = False) -> None:
        self.request_id, self.prompt_token_ids, self.run, self.n = (
            request_id, prompt_token_ids, run, n)
        self.token_ids: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list] = [[] for _ in range(n)]
        self.finish_reasons: list[str | None] = [None] * n
        self.stop_reasons: list[int | str | None] = [None] * n
        self.num_finished = 0
        self.prompt_logprobs: list | None = [None] if prompt_logprobs else None
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None

    @property
    def finished(self) -> bool:
        return self.num_finished == self.n


class EngineCoreClient:
    """Talks to the engine core from the API process's event loop.

    Args:
        conn: this process's liveness pipe to the core (its end of file = the core died).
        info: what the core reported when ready.
        input_address: the core's PULL address; output_address: this process's own.
        client_index: this API process's index (the core routes outputs by it).
        metrics: histograms observed as tokens arrive; stats snapshots go to `stats`.
    """

    def __init__(self, conn: Connection, info: CoreInfo, input_address: str,
                 output_address: str, client_index: int,
                 metrics: ServerMetrics | None = None) -> None:
        self.conn, self.info = conn, info
        self.input_address, self.output_address = input_address, output_address
        self.client_index = client_index
        self.metrics = metrics
        self.states: dict[str, RequestState] = {}
        # the core's snapshot once ready (tests build clients without a CoreInfo)
        self.stats: dict = dict(info.stats) if info is not None else {}
        self.num_prompt_tokens = 0  # admitted through this process
        self.num_finished: dict[str, int] = {}  # finish reason -> samples
        self.alive = True
        self.stopping: str | None = None  # the signal the core said it is stopping on
        self.failed: str | None = None  # the fault the core said it stopped on
        self.on_death: Callable[[], None] | None = None
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._zmq = zmq.asyncio.Context()
        self._push = self._zmq.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(self.input_address)
        self._pull = self._zmq.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.bind(self.output_address)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._on_pipe)
        self._tasks.append(asyncio.create_task(self._read_outputs(), name="core-outputs"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.alive:
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
        self._pull.close(linger=0)
        self._push.close(linger=0)
        self._zmq.term()

    def snapshot(self) -> dict:
        """The core's latest stats with this process's own request counts (for /metrics)."""
        return {**self.stats, "server_prompt_tokens": self.num_prompt_tokens,
                "server_finished": dict(self.num_finished)}

    # ------------------------------------------------------------ requests
    def add(self, state: RequestState, params: SamplingParams) -> None:
        """Send a validated request to the core; its tokens then arrive in `state`."""
        if not self.alive:
            state.run.fail(503, "the engine core is not running")
            return
        self.states[state.request_id] = state
        self.num_prompt_tokens += len(state.prompt_token_ids)
        self._send(Add(self.client_index, state.request_id, state.prompt_token_ids, params))

    def abort(self, request_ids: list[str]) -> None:
        """Forget these requests; those that have not finished are stopped in the core (their
        blocks freed before its next step). Every HTTP request ends with this call."""
        live = []
        for rid in request_ids:
            state = self.states.pop(rid, None)
            if state is not None and not state.finished:
                live.append(rid)
                self._count_finished("abort", state.n - state.num_finished)
        if live and self.alive:
            self._send(Abort(live))

    def _send(self, command) -> None:
        import zmq

        self._push.send(pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL),
                        zmq.NOBLOCK)

    def _count_finished(self, reason: str, num_samples: int = 1) -> None:
        self.num_finished[reason] = self.num_finished.get(reason, 0) + num_samples

    # ------------------------------------------------------------ outputs
    async def _read_outputs(self) -> None:
        import msgspec

        decode = msgspec.msgpack.Decoder(CoreOutputs).decode
        pull = self._pull
        while True:
            message = await pull.recv(copy=False)
            try:
                self._dispatch(decode(message.buffer))
            except Exception:  # a bug here must not stop every other request's stream
                logger.exception("dispatching engine outputs failed")

    def _dispatch(self, outputs: CoreOutputs) -> None:
        now = time.monotonic()
        states = self.states
        touched: dict[str, RequestState] = {}
        for rid, entries in outputs.prompt_logprobs:  # (before the tokens they precede)
            state = states.get(rid)
            if state is not None and state.prompt_logprobs is not None:
                state.prompt_logprobs += entries
        for rid, sample_index, token_id, logprobs, finish_reason, stop_reason in outputs.events:
            state = states.get(rid)
            if state is None:
                continue  # aborted meanwhile
            state.token_ids[sample_index].append(token_id)
            if logprobs is not None:
                state.logprobs[sample_index].append(logprobs)
            if finish_reason is not None:
                state.finish_reasons[sample_index] = finish_reason
                state.stop_reasons[sample_index] = stop_reason
                state.num_finished += 1
                self._count_finished(finish_reason)
            touched[rid] = state
        for failure in outputs.failures:
            state = states.pop(failure.request_id, None)
            if state is not None:
                state.run.fail(failure.status, failure.message)
        if outputs.stats is not None:
            self.stats = outputs.stats
        if not touched:
            return
        metrics = self.metrics
        gaps = []
        for state in touched.values():
            if state.first_token_time is None:
                state.first_token_time = now
                if metrics is not None:
                    metrics.time_to_first_token.observe(now - state.arrival_time)
            else:
                gaps.append(now - state.last_token_time)
            state.last_token_time = now
            if state.finished and metrics is not None:
                metrics.e2e_request_latency.observe(now - state.arrival_time)
            state.run.wake.set()
        if gaps and metrics is not None:
            metrics.inter_token_latency.observe_many(gaps)

    # ------------------------------------------------------------ death
    def _on_pipe(self) -> None:
        """The liveness pipe is readable: the core died (end of file) or sent something."""
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            self._core_died()
            return
        if isinstance(message, tuple) and message[:1] == ("stopping",):
            self.stopping = str(message[1])  # the end of file follows
            return
        if isinstance(message, tuple) and message[:1] == ("failed",):
            self.failed = str(message[1])  # the end of file follows
            return
        logger.warning("unexpected message from the engine core: %r", message)

    def _core_died(self) -> None:
        """The core's pipe ended: fail every request in flight. A core that stopped on a fault
        it sent ("failed": a tensor-parallel worker died or raised) fails them with that fault
        (500, as its own failure messages would have, had they been read first); otherwise
        503. A core that said it is stopping on a signal (a supervisor's stop of the whole
        process group) is logged as such, at INFO with nothing in flight; any other end is a
        crash (ERROR)."""
        if not self.alive:
            return
        self.alive = False
        asyncio.get_running_loop().remove_reader(self.conn.fileno())
        status = 503
        if self.failed is not None:
            status, reason = 500, self.failed
            logger.error("the engine core stopped after a fault (%s); failing %d requests",
                         reason, len(self.states))
        elif self.stopping is None:
            reason = "the engine core process died"
            logger.error("%s; failing %d requests", reason, len(self.states))
        else:
            reason = f"the engine core stopped on {self.stopping}"
            logger.log(logging.WARNING if self.states else logging.INFO,
                       "%s; failing %d requests", reason, len(self.states))
        for state in self.states.values():
            state.run.fail(status, f"{reason}; the server is shutting down")
        self.states.clear()
        if self.on_death is not None:
            self.on_death()
