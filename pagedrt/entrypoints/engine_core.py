"""The engine-core process of `pagedrt serve`: the LLMEngine in a busy loop, apart from HTTP.

    API process i                              engine-core process
    -------------                              -------------------
    Add / Abort  --- zmq PUSH -> PULL (one) -->  drain commands between two steps
                                                 engine.step()   (schedule, execute, update)
    CoreOutputs  <-- zmq PULL (own) <- PUSH ---  one message per step per API process: every
                                                 token sampled for its requests (TokenEvents),
                                                 the prompt logprobs the step computed for them
                                                 (PromptLogprobsEvents), failed requests, now
                                                 and then a stats snapshot
    liveness: one multiprocessing Pipe per API process (and one for the launcher); end of
    file on either side means the other process is gone.

Encoding: the per-step CoreOutputs go as msgspec msgpack (typed), the commands as pickle. For
a decode step of 256 streams, msgspec took 18 us to encode and 58 us to decode where pickle took
1,590 and 643 (CPU dev machine, benchmarks/diagnostics/transport.py); commands are one per
request and carry a SamplingParams, which pickle round-trips as it is.

The engine never waits on a client: sends go to zmq's I/O thread, whose queue has no bound, so
a slow API process costs memory, not steps. Detokenization, chat templates and SSE live in the
API process; the core only detokenizes requests with stop strings (it must find them to stop).

Faults: a ValueError from `add` fails that request only (400); an exception in a step fails
the requests in flight (500), which are aborted, and the loop goes on, unless it is an
`ExecutorError` (a tensor-parallel worker died or raised: the workers are gone), after which the
failures are sent, then a ("failed", message) notice on every liveness pipe, and the process
exits with status 1. The process exits when any liveness pipe
closes (a parent or API process died) or a Shutdown command arrives; an API process that stops
gracefully says ("leaving", index) on its pipe first, and the core then drops that pipe and
serves the others until their own drains end (the launcher closes its pipe last). On SIGTERM
the core first sends a ("stopping", "SIGTERM") notice on every pipe (SIGINT it ignores: the
launcher decides). See docs/design.md for the whole process layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import signal
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import NamedTuple

from pagedrt.config import EngineConfig
from pagedrt.engine.validation import EngineLimits
from pagedrt.outputs import PromptLogprobsEvent, TokenEvent
from pagedrt.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger("pagedrt.engine_core")

# Seconds between two stats snapshots sent while busy (one is always sent on going idle).
STATS_INTERVAL_S = 0.1
# How long the idle loop sleeps in poll() before looking again (it wakes at once on input).
_IDLE_POLL_MS = 200


# ---------------------------------------------------------------- messages (plain data)
class Add(NamedTuple):
    """API -> core: queue a request (already validated and tokenized by the API process)."""

    client_index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class Abort(NamedTuple):
    """API -> core: stop these requests and free their blocks (unknown ids are ignored)."""

    request_ids: list[str]


class Failure(NamedTuple):
    """A request the core could not run: its HTTP status (400 bad input, 500 server error)."""

    request_id: str
    status: int
    message: str


class CoreOutputs(NamedTuple):
    """Core -> API: what one step produced for one API process's requests (msgspec msgpack:
    typed, so it decodes back into these NamedTuples).

    Attributes:
        events: one TokenEvent per sampled token, in row order.
        failures: requests that ended with an error.
        stats: an `LLMEngine.stats()` snapshot, or None (sent every STATS_INTERVAL_S).
        prompt_logprobs: the prompt logprobs the step computed, one PromptLogprobsEvent per
            request that asked (SamplingParams.prompt_logprobs); a request's come in order,
            all of them before (or in the same message as) its first token. Read before
            `events`.
    """

    events: list[TokenEvent]
    failures: list[Failure]
    stats: dict | None
    prompt_logprobs: list[PromptLogprobsEvent] = []  # noqa: RUF012 - never mutated


@dataclass
class CoreInfo:
    """Core -> launcher and API processes, once the engine is built and warmed up."""

    limits: EngineLimits
    model_path: str
    tokenizer_path: str | None  # folder the API process loads the tokenizer from
    device: str
    dtype: str
    warm_up_s: float
    pid: int = field(default_factory=os.getpid)
    cpu_threads: int = 0  # torch's intra-op threads in the core ($PAGEDRT_NUM_THREADS)
    # `LLMEngine.stats()` once ready, so that /metrics has the pool's sizes from the first
    # scrape (later snapshots come with the outputs, every STATS_INTERVAL_S while busy)
    stats: dict = field(default_factory=dict)


@dataclass
class CoreSpec:
    """What the engine-core process is started with (pickled to it).

    Attributes:
        model, dtype, device, engine_config: as for `LLMEngine`.
        input_address: zmq address the core binds its PULL socket to.
        output_addresses: zmq address of each API process's PULL socket (index = client index).
        warm_up: run every kind of step once before saying it is ready.
        verbose: the core's log level INFO instead of WARNING (`pagedrt -v serve`).
    """

    model: str | None
    dtype: str
    device: str
    engine_config: EngineConfig
    input_address: str
    output_addresses: list[str]
    warm_up: bool = True
    verbose: bool = False  # log at INFO (scheduler events: preemptions, ...), as `pagedrt -v`


# ---------------------------------------------------------------- the process

def server_engine_config(config: EngineConfig) -> EngineConfig:
    """The settings a server's engine runs with: `config`, but with num_scheduler_steps None
    (auto, which bursts at small batches offline: `pagedrt.config.resolve_multi_step`) as 1,
    so that a stream gets its tokens one at a time; a number given is kept."""
    if config.num_scheduler_steps is None:
        return dataclasses.replace(config, num_scheduler_steps=1)
    return config


def run_engine_core(spec: CoreSpec, conns: list[Connection]) -> None:
    """Process entry point: build the engine, report CoreInfo (or the error: ("invalid",
    message) for a ValueError, bad settings; ("error", message with traceback) otherwise) on
    every pipe, then serve until a pipe closes or a Shutdown arrives."""
    # Ctrl-C reaches the whole process group: the launcher decides when the core stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO if spec.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        from pagedrt.engine.llm_engine import LLMEngine
        from pagedrt.entrypoints.cpu_threads import set_num_threads_from_env

        set_num_threads_from_env()  # a spawned process starts with torch's default again

        start = time.perf_counter()
        engine = LLMEngine(spec.model, server_engine_config(spec.engine_config),
                           dtype=spec.dtype, device=spec.device)
        if spec.warm_up:
            warm_up(engine)
        core = EngineCore(engine, conns, spec.input_address, spec.output_addresses)
        core.info.warm_up_s = time.perf_counter() - start
    except BaseException as e:  # reported to the launcher (logged), then exit non-zero
        if isinstance(e, ValueError):  # bad settings (a model path, a size): the message is all
            logging.getLogger("pagedrt.engine_core").debug("start-up refused", exc_info=True)
            report = ("invalid", str(e))
        else:
            report = ("error", f"engine core failed to start: {e!r}\n{traceback.format_exc()}")
        for conn in conns:
            try:
                conn.send(report)
            except OSError:
                pass
        raise SystemExit(2 if report[0] == "invalid" else 1) from None
    for conn in conns:
        conn.send(("ready", core.info))
    signal.signal(signal.SIGTERM, _stopping_notice(conns))
    with profiled("engine-core"):
        core.run()
    if core.fatal is not None:
        raise SystemExit(1)


def _stopping_notice(conns: list[Connection]):
    """The core's SIGTERM handler (installed once it is ready): tell every process on a
    liveness pipe that the core is stopping on a signal, then exit with status 0. A SIGTERM
    to the whole process group (a supervisor's stop, `timeout`) reaches the core and the API
    processes together; the notice, read before the pipe's end of file, lets an API process
    tell that from a crash (`EngineCoreClient._core_died`)."""
    def handler(signum, frame) -> None:
        for conn in conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stopping", signal.Signals(signum).name))
        raise SystemExit(0)
    return handler


@contextlib.contextmanager
def profiled(name: str):
    """cProfile the block into $PAGEDRT_PROFILE_DIR/NAME.prof when that variable is set (a
    diagnostic of the served processes: benchmarks/serve_record.sh sets it for one run)."""
    folder = os.environ.get("PAGEDRT_PROFILE_DIR")
    if not folder:
        yield
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        os.makedirs(folder, exist_ok=True)
        profile.dump_stats(os.path.join(folder, f"{name}.prof"))


class EngineCore:
    """The loop around one LLMEngine (any object with its add_validated_request, abort_request,
    step, has_unfinished_requests, stats, requests, limits, model_path, tokenizer, device and
    dtype will do: tests pass a stand-in). Sets `engine.token_events`.

    Args:
        engine: the engine, built and warmed up.
        conns: liveness pipes; the loop ends when any of them closes.
        input_address: zmq address to bind the command socket (PULL) to.
        output_addresses: each API process's output socket (index = its client_index).
    """

    def __init__(self, engine, conns: list[Connection], input_address: str,
                 output_addresses: list[str]) -> None:
        import msgspec
        import zmq

        self.engine = engine
        self.conns = conns
        self.events: list = []
        engine.token_events = self.events
        self.prompt_events: list = []
        engine.prompt_logprob_events = self.prompt_events
        tokenizer = engine.tokenizer
        import torch

        self.info = CoreInfo(
            limits=engine.limits, model_path=engine.model_path,
            tokenizer_path=None if tokenizer is None else tokenizer.name_or_path,
            device=str(engine.device), dtype=str(engine.dtype).replace("torch.", ""),
            warm_up_s=0.0, cpu_threads=torch.get_num_threads(),
            stats=engine.stats(detailed=False))
        self._encoder = msgspec.msgpack.Encoder()
        self.zmq_context = zmq.Context(io_threads=1)
        self.input = self.zmq_context.socket(zmq.PULL)
        self.input.setsockopt(zmq.RCVHWM, 0)
        self.input.bind(input_address)
        self.outputs = []
        for address in output_addresses:
            sock = self.zmq_context.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 0)  # no bound: never block the engine on a client
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            self.outputs.append(sock)
        self.poller = zmq.Poller()
        self.poller.register(self.input, zmq.POLLIN)
        for conn in conns:
            self.poller.register(conn.fileno(), zmq.POLLIN)
        self.client_of: dict[str, int] = {}  # request_id -> API process index
        self.failures: list[list[Failure]] = [[] for _ in self.outputs]
        self._last_stats_time = 0.0
        self._stopping = False
        # why the loop stopped after a fault it cannot outlive (the message each request in
        # flight was failed with); also sent as ("failed", fatal) on every liveness pipe
        self.fatal: str | None = None
        # seconds spent per part of the loop, and steps run: logged when the loop ends
        self.loop_time_s = {"poll": 0.0, "commands": 0.0, "step": 0.0, "publish": 0.0}
        self.num_steps = 0
        # $PAGEDRT_STEP_TRACE=FILE: a timeline of the served run, written as JSON at exit: per
        # step [start s, end s, sequences, tokens], per request added [time s, prompt tokens]
        # (time.perf_counter; a diagnostic for benchmarks/serve_record.sh)
        self.trace_path = os.environ.get("PAGEDRT_STEP_TRACE")
        self.trace: dict[str, list] = {"steps": [], "adds": []}

    # ------------------------------------------------------------ loop
    def run(self) -> None:
        import zmq

        engine = self.engine
        clock = time.perf_counter
        spent = self.loop_time_s
        try:
            while not self._stopping:
                t0 = clock()
                busy = engine.has_unfinished_requests()
                ready = dict(self.poller.poll(0 if busy else _IDLE_POLL_MS))
                if len(ready) > (self.input in ready) and self._pipes_end(ready):
                    # a shutdown or a crash: the launcher reports which
                    logger.info("a liveness pipe closed; the engine core exits")
                    return
                t1 = clock()
                if self.input in ready:
                    while True:
                        try:
                            message = self.input.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._apply(pickle.loads(message))
                t2 = clock()
                if engine.has_unfinished_requests():
                    self._step()
                    self.num_steps += 1
                    if self.trace_path:
                        plan = engine.last_scheduler_output
                        self.trace["steps"].append([t2, clock(), len(plan.req_ids),
                                                    plan.total_num_tokens])
                t3 = clock()
                now = time.monotonic()
                stats_due = now - self._last_stats_time > STATS_INTERVAL_S
                if (self.events or self.prompt_events or any(self.failures)
                        or (stats_due and busy)):
                    self._publish(stats_due)
                elif not busy and stats_due and self._last_stats_time >= 0:
                    self._publish(True)  # one snapshot on going idle, then quiet
                    self._last_stats_time = -1.0
                spent["poll"] += t1 - t0
                spent["commands"] += t2 - t1
                spent["step"] += t3 - t2
                spent["publish"] += clock() - t3
        finally:
            names = {"poll": "waiting for work", "commands": "taking requests",
                     "step": "engine steps", "publish": "sending outputs"}
            print(f"pagedrt engine core: stopped after {self.num_steps} engine steps; seconds "
                  "of its loop spent " + ", ".join(f"{names[k]} {v:.2f}"
                                                   for k, v in spent.items()), flush=True)
            if self.trace_path:
                import json

                with open(self.trace_path, "w") as f:
                    json.dump(self.trace, f)
            self.input.close(linger=0)
            for sock in self.outputs:  # after a fault, the failures just sent must get out
                sock.close(linger=1000 if self.fatal is not None else 0)
            self.zmq_context.term()
            if self.fatal is not None:
                # the API processes read this pipe and the outputs in whichever order they
                # become readable; with this notice, one that sees the pipe end before the
                # failures still fails its requests with the fault (500), not as a crash (503)
                for conn in self.conns:
                    with contextlib.suppress(OSError, ValueError):
                        conn.send(("failed", self.fatal))

    def _pipes_end(self, ready: dict) -> bool:
        """Read the liveness pipes that poll found readable: True if one ended (its process is
        gone without a word: the loop must end). An API process that stops gracefully sends
        ("leaving", index) first, once its drain is over; its pipe is then dropped and the
        loop goes on serving the others, which may still be draining (`pagedrt serve
        --api-server-count` > 1 under SIGTERM)."""
        for conn in list(self.conns):
            if conn.fileno() not in ready:
                continue
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return True
            if isinstance(message, tuple) and message[:1] == ("leaving",):
                self.poller.unregister(conn.fileno())
                self.conns.remove(conn)
                conn.close()
        return False

    def _apply(self, command) -> None:
        engine = self.engine
        if isinstance(command, Add):
            rid = command.request_id
            try:
                engine.add_validated_request(rid, command.prompt_token_ids, command.params)
            except ValueError as e:
                self.failures[command.client_index].append(Failure(rid, 400, str(e)))
                return
            except Exception as e:
                logger.exception("adding request %s failed", rid)
                self.failures[command.client_index].append(
                    Failure(rid, 500, f"adding the request failed: {e!r}"))
                return
            self.client_of[rid] = command.client_index
            if self.trace_path:
                self.trace["adds"].append([time.perf_counter(), len(command.prompt_token_ids)])
            if self._last_stats_time < 0:
                self._last_stats_time = 0.0  # busy again: snapshots resume
        elif isinstance(command, Abort):
            for rid in command.request_ids:
                if self.client_of.pop(rid, None) is not None:
                    engine.abort_request(rid)
        elif command == "shutdown":
            self._stopping = True
        else:
            logger.error("unknown command %r", command)

    def _step(self) -> None:
        from pagedrt.distributed.executor import ExecutorError

        try:
            self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; failing %d requests", len(self.client_of))
            self.events.clear()
            self.prompt_events.clear()
            for rid, client in self.client_of.items():
                self.engine.abort_request(rid)
                self.failures[client].append(Failure(rid, 500, f"engine step failed: {e!r}"))
            self.client_of.clear()
            if isinstance(e, ExecutorError):  # the model's workers are gone: so is the core
                self.fatal = f"engine step failed: {e!r}"  # what each request was failed with
                self._stopping = True

    def _publish(self, with_stats: bool) -> None:
        """Send this step's events and failures, one message per API process."""
        import zmq

        stats = None
        if with_stats:
            stats = self.engine.stats(detailed=False)
            self._last_stats_time = time.monotonic()
        events = self.events
        per_client = self._per_client(events)
        prompt_per_client = self._per_client(self.prompt_events)
        encode = self._encoder.encode
        for client, sock in enumerate(self.outputs):
            failures = self.failures[client]
            if per_client[client] or prompt_per_client[client] or failures or stats is not None:
                sock.send(encode(CoreOutputs(per_client[client], failures, stats,
                                             prompt_per_client[client])), zmq.NOBLOCK,
                          copy=False)
            self.failures[client] = []
        self.prompt_events.clear()
        # requests whose last sample finished this step are no longer the core's
        requests = self.engine.requests
        for event in events:
            if event[4] is not None and event[0] not in requests:
                self.client_of.pop(event[0], None)
        events.clear()

    def _per_client(self, events: list) -> list[list]:
        """Events (NamedTuples whose first field is the request id) split by API process."""
        if len(self.outputs) == 1:
            return [events]
        per_client = [[] for _ in self.outputs]
        client_of = self.client_of
        for event in events:
            client = client_of.get(event[0])
            if client is not None:
                per_client[client].append(event)
        return per_client


# ---------------------------------------------------------------- warm-up
def warm_up(engine) -> None:
    """Run each kind of step the server will take once, so that no kernel variant or code path
    is compiled or loaded while a client waits: a prefill, the same prompt again (a prefix-cache
    hit: extend over cached blocks), decodes alone and batched with a chunked prefill, sampled
    rows with top-k/top-p/min-p, penalties, seeds, logprobs, prompt logprobs and n = 2, and a
    beam search beside them (log-softmax, top-k and sort kernels, the partial-block copy). Then
    the engine's counters and peaks are reset (the warm-up blocks stay in the prefix cache,
    evictable)."""
    limits = engine.limits
    long_len = 512 if engine.device.type == "cuda" else 32
    long_len = max(1, min(long_len, limits.max_model_len // 2 - 8,
                          limits.kv_capacity_tokens // 8))
    vocab = limits.vocab_size
    prompt = [(7 + 13 * i) % vocab for i in range(long_len)]
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, max_tokens=4,
                             ignore_eos=True, logprobs=2, prompt_logprobs=2, seed=1,
                             presence_penalty=0.5,
                             frequency_penalty=0.5, repetition_penalty=1.1)
    batches = [
        [(prompt, greedy)],
        [(prompt, greedy)],  # prefix-cache hit
        [(prompt[: long_len // 2] + [1, 2, 3], greedy), (prompt[:3], sampled),
         ([5] * 3, SamplingParams(temperature=1.0, n=2, max_tokens=3, ignore_eos=True)),
         ([9] * 5, BeamSearchParams(beam_width=2, max_tokens=4).to_sampling_params())],
    ]
    for i, batch in enumerate(batches):
        ids = []
        for j, (tokens, params) in enumerate(batch):
            rid = f"warm-up-{i}-{j}"
            engine.add_validated_request(rid, list(tokens), params, stream=False)
            ids.append(rid)
        deadline = time.monotonic() + 600
        while engine.has_unfinished_requests():
            engine.step()
            if time.monotonic() > deadline:
                raise RuntimeError("warm-up did not finish in 600 s")
    engine.reset_stats()
