"""The executor: the engine's handle on the device side, whether one rank in the engine's own
process or N tensor-parallel worker processes (docs/design.md, "Tensor parallelism").

    LLMEngine.step --plan--> Executor.execute --+--> local Worker (this process), or
                                                +--> every worker process (the same bytes)
    LLMEngine.step <-result- Executor.fetch  <-----  rank 0's sampled tokens

Three layouts, picked by `create_executor`:

    uni       one rank, in this process (tensor_parallel_size 1; the default)
    mp        N worker processes started here with torch.multiprocessing (spawn), one per
              GPU (cuda:0 .. cuda:N-1) or N CPU processes; this process holds no model
    torchrun  this process is torchrun's rank 0 and runs rank 0's worker itself; ranks 1..N-1
              are the other torchrun processes (pagedrt/distributed/torchrun.py)

Every remote rank has a `multiprocessing.connection.Connection` to this process (a pipe, or a
TCP socket under torchrun) over which it receives each command and answers. A plan is pickled
once and the same bytes go to every rank; rank 0's worker answers `fetch`. The ranks then run
the forward together over their own torch.distributed group.

Faults. Every wait is bounded (`PAGEDRT_WORKER_TIMEOUT_S`, 600 s by default, for an answer that
does not come; a dead peer is noticed at once): a worker that raises sends its traceback and
exits; a worker process that dies is seen by a monitor thread, which then kills the other
workers (one of them may be blocked in a collective with the dead one), so that the engine's
wait ends with end-of-file within a second. Either way the executor stops every worker and
raises `ExecutorError`, and so does every later call; the engine then ends its requests with
that error.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

import torch

from pagedrt.config import EngineConfig
from pagedrt.core.plan import StepPlan, StepResult
from pagedrt.distributed.group import SINGLE_RANK, torchrun_env
from pagedrt.distributed.sharding import check_devices, check_tensor_parallel
from pagedrt.distributed.worker import (
    ALL_REPLY,
    NO_REPLY,
    RANK0_REPLIES,
    Worker,
    WorkerSpec,
    run_worker_process,
)
from pagedrt.engine.profiling import NULL_CLOCK
from pagedrt.models.loader import LoadedModel, load_model, load_tokenizer, resolve_checkpoint
from pagedrt.models.weights import RandomWeights, TensorWeights

logger = logging.getLogger("pagedrt.executor")

WATCH_SPIN_S = 0.2
"""Seconds rank 0 polls its step's event and the other ranks' connections without sleeping
(`Executor._wait_device`; a decode step, and most prefill steps, end within it); after that,
every WATCH_POLL_S."""
WATCH_POLL_S = 0.0002

WORKER_TIMEOUT_S = float(os.environ.get("PAGEDRT_WORKER_TIMEOUT_S", "600"))
"""Seconds the engine waits for a worker's answer (loading the model, capturing CUDA graphs, one
step) before it gives up on the workers (`PAGEDRT_WORKER_TIMEOUT_S`)."""


class ExecutorError(RuntimeError):
    """A worker raised, died or did not answer in time; every worker has been stopped.

    Attributes:
        from_value_error: the worker's exception was a ValueError (bad settings found while
            starting, such as a process group that could not form).
    """

    def __init__(self, message: str, from_value_error: bool = False) -> None:
        super().__init__(message)
        self.from_value_error = from_value_error


@dataclass
class RemoteRank:
    """A rank in another process: the connection to it, and its process when this process
    started it (None for a torchrun rank)."""

    rank: int
    conn: Connection
    process: Any = None


@dataclass(frozen=True)
class RemoteStep:
    """A step launched on worker processes (what `Executor.execute` returns for them)."""

    step_id: int


@dataclass
class _Health:
    """Shared by an executor and its monitor thread (which must not hold the executor)."""

    death: tuple[int, str] | None = None  # (rank, why) of the first worker process to die
    closing: bool = False  # the executor is stopping its workers: deaths are expected
    failed: bool = False  # a fault: stop the workers at once, without waiting for them
    lock: threading.Lock = field(default_factory=threading.Lock)


class Executor:
    """Runs plans on the ranks; see the module docstring. Built by `create_executor`.

    Attributes:
        tp_size: ranks the model is split over.
        local: the Worker running in this process (rank 0), or None.
        remotes: the ranks in other processes, rank order.
        model_config, tokenizer, model_path, max_model_len: of the model.
        num_blocks, num_cpu_blocks: KV blocks every rank holds (the minimum over ranks).
        dead: why the executor stopped after a fault, else None.
    """

    def __init__(self, local: Worker | None, remotes: list[RemoteRank], tokenizer,
                 model_path: str, release_on_shutdown: bool = False) -> None:
        self.local = local
        self.remotes = remotes
        self.tp_size = len(remotes) + (local is not None)
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.dead: str | None = None
        self.num_blocks = self.num_cpu_blocks = 0
        self._health = _Health()
        self._closed = False
        self._seq = 0  # the number of the last command sent; answers echo theirs
        # answers _poll_errors read before their _gather: rank -> [(command number, answer)]
        self._early: dict[int, list] = {}
        processes = [r.process for r in remotes if r.process is not None]
        monitor = None
        if processes:
            monitor = threading.Thread(target=_monitor, args=(processes, self._health),
                                       name="pagedrt-worker-monitor", daemon=True)
            monitor.start()
        self._finalizer = weakref.finalize(self, _stop, processes,
                                           [r.conn for r in remotes], self._health,
                                           release_on_shutdown, monitor)

    @property
    def model_config(self):
        return self._spec.model_config

    @property
    def max_model_len(self) -> int:
        return self._spec.max_model_len

    @property
    def model_runner(self):
        """The ModelRunner of the rank in this process, else None."""
        return None if self.local is None else self.local.model_runner

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes this executor started, rank order."""
        return [r.process.pid for r in self.remotes if r.process is not None]

    # ------------------------------------------------------------ start-up
    def start(self, spec: WorkerSpec) -> None:
        """Give every rank its spec, load the model shards, size the KV cache to what every
        rank holds, then build each rank's cache and model runner."""
        self._spec = spec
        if self.remotes:
            self._send("init", (spec,), NO_REPLY)
        fits = self.collective_rpc("load_model")
        self.num_blocks = min(n for n, _ in fits)
        self.num_cpu_blocks = min(c for _, c in fits)
        self.collective_rpc("init_device_side", self.num_blocks, self.num_cpu_blocks)

    # ------------------------------------------------------------ steps
    def execute(self, plan: StepPlan, clock=NULL_CLOCK):
        """Send the plan to every rank and run it (ModelRunner.execute); returns a handle for
        `fetch` before the device is done, or None for a plan that runs nothing."""
        self._check_alive()
        if self.remotes:
            self._send("execute", (plan,), NO_REPLY)
        if self.local is None:
            clock.mark("send")  # the forward and the sampling show in "update" (fetch)
            return RemoteStep(plan.step_id) if plan else None
        return self._local_call(self.local.model_runner.execute, plan, clock)

    def fetch(self, step) -> StepResult:
        """Wait for a step's sampled tokens (rank 0's) and write them into every rank's rows."""
        self._check_alive()
        if self.remotes:
            self._send("fetch", (step.step_id,), NO_REPLY if self.local else RANK0_REPLIES)
        if self.local is None:
            return self._gather([0])[0]
        return self._local_call(self._wait_and_fetch, step)

    def _wait_and_fetch(self, step) -> StepResult:
        """Rank 0's part of `fetch`: with other ranks, wait for the step's device work while
        watching them (`_wait_device`); then the model runner's fetch."""
        if self.remotes:
            self._wait_device(step)
        return self.local.model_runner.fetch(step)

    def _wait_device(self, step) -> None:
        """Rank 0 in this process, under tensor parallelism: wait for the step's device work
        (its `event`) while watching the other ranks' connections. They send nothing during a
        step, so a message then is a rank's error and an end of file its exit; either fails
        the step at once (`_poll_errors`). Without this, rank 0's device would wait in the
        step's all-reduce for a rank that left it, and NCCL notices that only when the
        collective times out (PAGEDRT_DIST_TIMEOUT_S, 300 s), the clients waiting meanwhile.
        Spins for the first WATCH_SPIN_S (most steps' whole wait), then checks every
        WATCH_POLL_S. Runs inside `_local_call`, so a device error or an interrupt here stops
        the ranks as one in the fetch itself does."""
        event = step.event
        if event is None:
            return
        conns = [r.conn for r in self.remotes]
        spin_until = time.monotonic() + WATCH_SPIN_S
        while not event.query():
            timeout = 0.0 if time.monotonic() < spin_until else WATCH_POLL_S
            if wait(conns, timeout=timeout):
                self._poll_errors()  # an error message or an end of file raises here

    def collective_rpc(self, method, *args, timeout_s: float = WORKER_TIMEOUT_S) -> list:
        """Call a Worker method (by name), or a function `f(worker, *args)` defined at module
        level, on every rank; returns the results in rank order."""
        self._check_alive()
        if self.remotes:
            self._send(method, args, ALL_REPLY)
        results = {}
        if self.local is not None:
            if isinstance(method, str):
                results[0] = self._local_call(getattr(self.local, method), *args)
            else:
                results[0] = self._local_call(method, self.local, *args)
        results.update(self._gather([r.rank for r in self.remotes], timeout_s))
        return [results[rank] for rank in range(self.tp_size)]

    def row_snapshots(self) -> list[dict]:
        """Every rank's rows (Worker.row_snapshot), rank order."""
        return self.collective_rpc("row_snapshot")

    def shutdown(self) -> None:
        """Stop the worker processes (or, under torchrun, release the other ranks for the
        next engine); later calls raise ExecutorError."""
        if not self._closed:
            self._closed = True
            self.dead = self.dead or "the executor was shut down"
            self._finalizer()
            self.local = None

    # ------------------------------------------------------------ internals
    def _check_alive(self) -> None:
        if self.dead is not None:
            raise ExecutorError(f"the model workers have stopped: {self.dead}")

    def _local_call(self, fn, *args):
        if not self.remotes:
            return fn(*args)  # one rank: its errors are those of an in-process engine
        self._poll_errors()
        try:
            return fn(*args)
        except ExecutorError:  # another rank's fault, already handled (`_fail`)
            raise
        except Exception as e:  # the ranks are out of step: stop them all
            logger.exception("tensor-parallel rank 0 (this process) failed")
            self._fail(f"rank 0: {type(e).__name__}: {e}", isinstance(e, ValueError), 0)
        except BaseException as e:  # KeyboardInterrupt: rank 0 may have left a collective
            with self._health.lock:
                self._health.failed = True
            self._stop_failed(f"rank 0 was interrupted ({type(e).__name__})")
            raise

    def _send(self, method, args: tuple, reply: int) -> None:
        self._seq += 1
        data = pickle.dumps((method, args, reply, self._seq), protocol=pickle.HIGHEST_PROTOCOL)
        for r in self.remotes:
            try:
                r.conn.send_bytes(data)
            except OSError as e:
                self._fail(f"rank {r.rank} cannot be reached ({e!r}): it exited")

    def _gather(self, ranks: list[int], timeout_s: float = WORKER_TIMEOUT_S) -> dict[int, Any]:
        """The answers of `ranks` to the last command sent, failing on any error message, end
        of file or time-out. An answer to an earlier command is dropped: its gather was
        interrupted (a KeyboardInterrupt while waiting), and the ranks answer in order."""
        out: dict[int, Any] = {}
        for rank in ranks:
            for seq, answer in self._early.pop(rank, []):
                if seq == self._seq:
                    out[rank] = answer
        pending = set(ranks) - set(out)
        deadline = time.monotonic() + timeout_s
        by_conn = {r.conn: r for r in self.remotes}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(f"ranks {sorted(pending)} did not answer within {timeout_s:.0f} s "
                           "(PAGEDRT_WORKER_TIMEOUT_S)")
            for conn in wait(list(by_conn), timeout=min(remaining, 1.0)):
                rank, seq, answer = self._receive(by_conn[conn])
                if seq == self._seq and rank in pending:  # (else an interrupted gather's)
                    out[rank] = answer
                    pending.discard(rank)
        return out

    def _poll_errors(self) -> None:
        """Fail now if a remote rank has reported an error or gone away. An answer that has
        already come is kept for the `_gather` that asks for it: a fast rank can answer a
        command before rank 0 has run its own part of it."""
        for r in self.remotes:
            try:
                ready = r.conn.poll(0)
            except (EOFError, OSError):
                self._fail(f"rank {r.rank} exited")
            if ready:
                rank, seq, answer = self._receive(r)
                self._early.setdefault(rank, []).append((seq, answer))

    def _receive(self, r: RemoteRank) -> tuple[int, int, Any]:
        """(rank, command number, answer) of the next message from `r`; fails on an error
        message or an end of file."""
        try:
            data = r.conn.recv_bytes()
        except (EOFError, OSError):
            self._fail(f"rank {r.rank} exited")
        message = pickle.loads(data)
        if message[0] == "error":
            self._fail(_logged(message), message[2], message[1])
        return message[1], message[3], message[2]

    def _fail(self, reason: str, from_value_error: bool = False,
              error_rank: int | None = None) -> NoReturn:
        """Stop every worker and raise ExecutorError with the root cause: `reason` is rank
        `error_rank`'s own error message, or a symptom (an end of file, a time-out) when
        `error_rank` is None. A worker process that died is the root cause, with its own error
        message if it sent one: the errors of other ranks (a collective that lost its peer)
        follow from it. Otherwise the lowest rank's error message, else `reason`."""
        errors = {} if error_rank is None else {error_rank: (reason, from_value_error)}
        errors.update(self._queued_errors())
        health = self._health
        processes = [r.process for r in self.remotes if r.process is not None]
        # A process that exited makes its sentinel ready at once, and the monitor names it
        # within a moment; the end of file that brought us here can come first. Wait up to 3 s
        # for the monitor while some process has exited, and a short grace when none has.
        sentinels = [p.sentinel for p in processes]
        start = time.monotonic()
        grace_s = 0.5 if error_rank is None else 0.1
        while True:
            with health.lock:
                death = health.death
            elapsed = time.monotonic() - start
            if death is not None or elapsed > 3.0:
                break
            if wait(sentinels, timeout=0.02):
                time.sleep(0.01)  # one has exited: the monitor is reaping it
            elif elapsed > grace_s:
                break
        with health.lock:
            health.failed = True
        # a rank that sent its error and then exited: its message is in the pipe by the time
        # its death is seen, but may not have been when the queue was first drained
        errors.update(self._queued_errors())
        if death is not None:
            dead_rank, text = death
            reason, from_value_error = errors.get(dead_rank, (text, False))
        elif errors:
            reason, from_value_error = errors[min(errors)]
        self._stop_failed(reason)
        raise ExecutorError(f"tensor-parallel worker failed: {reason}", from_value_error)

    def _stop_failed(self, reason: str) -> None:
        """After a fault (`_health.failed` set): stop every worker at once; later calls raise
        ExecutorError naming `reason`. With rank 0 in this process, its process group is
        aborted too: its device may be waiting in a collective for a rank that left."""
        self.dead = reason
        self._closed = True
        self._finalizer()
        if self.local is not None:
            _abort_process_group()

    def _queued_errors(self) -> dict[int, tuple[str, bool]]:
        """rank -> (text, is_value_error) of the error messages the remote ranks have sent."""
        errors = {}
        for r in self.remotes:
            try:
                while r.conn.poll(0):
                    message = pickle.loads(r.conn.recv_bytes())
                    if message[0] == "error":
                        errors[message[1]] = (_logged(message), message[2])
            except (EOFError, OSError):
                continue
        return errors


def _abort_process_group() -> None:
    """Abort this process's default process group where torch can (NCCL's abort ends the
    kernels of a collective that a peer left); nothing where it cannot, or none formed."""
    import torch.distributed as dist

    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is None or not (dist.is_available() and dist.is_initialized()):
        return
    try:
        abort()
    except (RuntimeError, ValueError, NotImplementedError) as e:  # a backend without abort
        logger.warning("could not abort the process group after a fault: %r", e)


def _logged(message: tuple) -> str:
    """Log a worker's error message with its traceback; returns its one-line summary."""
    if message[4]:
        logger.error("tensor-parallel worker rank %d failed:\n%s", message[1], message[4])
    return message[3]


def _monitor(processes: list, health: _Health) -> None:
    """Thread: wait for any worker process to end; unless the executor is closing, note which
    and why (`health.death`: (rank, text)) and kill the others (which may be blocked in a
    collective with the dead one)."""
    sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(processes)}
    ready = wait(list(sentinels))
    with health.lock:
        if health.closing:
            return
        rank, p = sentinels[ready[0]]
        p.join(1.0)
        text = f"worker process {p.name} (pid {p.pid}) exited with status {p.exitcode}"
        health.death = (rank, text)
    _kill(processes)


def _kill(processes: list, timeout_s: float = 10.0) -> None:
    """SIGKILL the processes still running and reap them, waiting at most `timeout_s` in all.
    A join can return before its process is reaped when another thread (the monitor) reaps it
    at the same moment, so this waits for the exit code itself."""
    for p in processes:
        if p.exitcode is None:
            p.kill()
    deadline = time.monotonic() + timeout_s
    for p in processes:
        while p.exitcode is None and time.monotonic() < deadline:
            p.join(0.05)


def _stop(processes: list, conns: list[Connection], health: _Health, release: bool,
          monitor: threading.Thread | None = None) -> None:
    """Shut the remote ranks down (or release them: torchrun ranks wait for the next engine)
    and close the connections. After a fault the worker processes are killed at once (one may
    be blocked in a collective); otherwise those still alive after 5 s are."""
    with health.lock:
        health.closing = True
        failed = health.failed
    if failed:
        _kill(processes)
    message = pickle.dumps(("release" if release and not failed else "shutdown", (), NO_REPLY,
                            0))
    for conn in conns:
        try:
            conn.send_bytes(message)
        except OSError:
            pass
        if failed or not release:
            conn.close()
    deadline = time.monotonic() + 5.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    _kill(processes)
    if monitor is not None and monitor is not threading.current_thread():
        monitor.join(5.0)  # it returns once a process has ended (all have, or are killed)


# ---------------------------------------------------------------- construction
def resolve_max_model_len(config: EngineConfig, model_config) -> int:
    """config.max_model_len, or the model's max_position_embeddings; ValueError beyond it."""
    max_len = config.max_model_len or model_config.max_position_embeddings
    if max_len > model_config.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_len} exceeds the model's "
            f"max_position_embeddings={model_config.max_position_embeddings}; pass at most "
            f"that (`--max-model-len` on the command line), or none for the model's own")
    return max_len


def create_executor(model: str | RandomWeights | None, loaded: LoadedModel | None,
                    config: EngineConfig, dtype: torch.dtype,
                    device: torch.device) -> Executor:
    """The executor for `config`: under torchrun, this process as rank 0 of the torchrun
    ranks; else one rank here ('uni') or `tensor_parallel_size` worker processes ('mp').

    Args:
        model: a path, RandomWeights, or None (the default model).
        loaded: an already loaded model (single-rank, CPU for 'mp'), used instead of `model`.
    Raises:
        ValueError: a split the model does not allow, more ranks than visible GPUs, a process
            group that cannot form (the reason is in the message), a mismatch with torchrun's
            WORLD_SIZE, or any of the loader's errors.
    """
    run = torchrun_env()
    tp_size = config.tensor_parallel_size
    backend = config.distributed_executor_backend
    if run is None and (backend == "uni" or (backend == "auto" and tp_size == 1)):
        loaded = loaded or load_model(model, dtype, device)
        spec = WorkerSpec(loaded.model_config, None, config, dtype,
                          resolve_max_model_len(config, loaded.model_config))
        executor = Executor(Worker(spec, SINGLE_RANK, device, model=loaded.model), [],
                            loaded.tokenizer, loaded.model_path)
        executor.start(spec)
        return executor
    if loaded is not None:
        if loaded.model.tp.size != 1:
            raise ValueError("a LoadedModel for tensor parallelism must hold the whole model")
        # copies, each with its own storage: views would pickle their whole fused storage
        weights = TensorWeights({k: v.detach().to("cpu", copy=True) for k, v in
                                 loaded.model.hf_state_dict().items()})
        mc, tokenizer, path = loaded.model_config, loaded.tokenizer, loaded.model_path
    else:
        ckpt = resolve_checkpoint(model)
        weights, mc, path = ckpt.weights, ckpt.model_config, ckpt.model_path
        tokenizer = load_tokenizer(ckpt.tokenizer_dir)
    check_tensor_parallel(mc, tp_size)
    spec = WorkerSpec(mc, weights, config, dtype, resolve_max_model_len(config, mc))
    if run is not None:
        from pagedrt.distributed.torchrun import torchrun_executor

        return _started(torchrun_executor(spec, run, device, tokenizer, path), spec)
    first = (device.index or 0) if device.type == "cuda" else 0
    check_devices(tp_size, device.type, first,
                  torch.cuda.device_count() if device.type == "cuda" else 0)
    devices = [f"cuda:{first + r}" if device.type == "cuda" else "cpu" for r in range(tp_size)]
    return _started(_spawn_workers(devices, tokenizer, path), spec)


def _started(executor: Executor, spec: WorkerSpec) -> Executor:
    """Start the executor; a worker's ValueError (a process group that did not form, bad
    weights) is raised as a ValueError, anything else as ExecutorError."""
    try:
        executor.start(spec)
    except ExecutorError as e:
        if e.from_value_error:
            raise ValueError(str(e)) from None
        raise
    return executor


def _spawn_workers(devices: list[str], tokenizer, model_path: str) -> Executor:
    """One worker process per device, joined in a process group through a file store in a
    fresh temporary folder (`PAGEDRT_DIST_INIT_METHOD` overrides it, e.g.
    tcp://127.0.0.1:29500)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    init_method = os.environ.get("PAGEDRT_DIST_INIT_METHOD")
    store_dir = None
    if not init_method:
        store_dir = tempfile.mkdtemp(prefix="pagedrt-tp-")
        init_method = f"file://{store_dir}/store"
    remotes = []
    try:
        for rank, device in enumerate(devices):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=run_worker_process,
                            args=(rank, len(devices), device, init_method, child_end),
                            name=f"pagedrt-tp-worker-{rank}", daemon=True)
            p.start()
            child_end.close()
            remotes.append(RemoteRank(rank, parent_end, p))
    except BaseException:
        _kill([r.process for r in remotes])
        raise
    executor = Executor(None, remotes, tokenizer, model_path)
    if store_dir is not None:
        weakref.finalize(executor, _remove_store, store_dir)
    return executor


def _remove_store(folder: str) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
