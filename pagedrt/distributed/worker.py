"""The device side of one tensor-parallel rank (`Worker`), and the command loop of a worker
process (`serve`).

A worker holds its rank's shard of the model, a KV cache with its rank's KV heads, and a
`ModelRunner` that keeps the same rows as every other rank's: all ranks receive the same plans
in the same order, run the forward together (the layers' collectives) and sample the same
tokens from the same gathered logits. Only rank 0's tokens go back to the engine.

    engine (pagedrt/distributed/executor.py)        worker process of rank r
    ("init", WorkerSpec)                      --->  Worker(spec, tp, device): nothing loaded
    "load_model"                              --->  build the shard, load its weights;
                                              <---  (KV blocks that fit, CPU swap blocks)
    "init_device_side", num_blocks, num_cpu   --->  KV cache (the engine's minimum over ranks,
                                                    so block ids mean the same everywhere),
                                                    ModelRunner (GEMM warm-up, CUDA graphs)
    "execute", plan                           --->  ModelRunner.execute (no answer)
    "fetch", step_id                          --->  ModelRunner.fetch; rank 0 answers with the
                                              <---  StepResult
    ("release",) / ("shutdown",)              --->  drop the worker and wait for the next
                                                    init (torchrun ranks) / exit

Messages are pickled tuples: to a worker (method, args, reply, seq), `reply` one of NO_REPLY,
RANK0_REPLIES, ALL_REPLY, `seq` the command's number; back ("ok", rank, value, seq) or
("error", rank, is_value_error, summary, traceback). The engine drops an answer whose seq is
not that of the command it waits on (one whose wait was interrupted).
A worker that raises sends its traceback and exits: the ranks are out of step from then on, and
the engine stops them all. A worker whose engine goes away (end of file on its connection, or
its parent process gone) exits.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from pagedrt.config import EngineConfig, ModelConfig
from pagedrt.core.plan import StepPlan, StepResult
from pagedrt.distributed.group import SINGLE_RANK, ProcessGroupError, TPGroup, init_tp_group
from pagedrt.models.weights import RandomWeights, SafetensorsWeights, TensorWeights

NO_REPLY, RANK0_REPLIES, ALL_REPLY = 0, 1, 2


@dataclass
class WorkerSpec:
    """What every rank's worker is built from (the same for all ranks; pickled to them).

    Attributes:
        model_config: the whole model's shape.
        weights: the full weights, each rank keeps its slice; None for a worker given its
            model already built (the engine's own process, one rank).
        engine_config: block size, batching limits, memory budgets, CUDA graphs, seed.
        dtype: of the weights (and of the KV cache unless engine_config.kv_cache_dtype says
            otherwise).
        max_model_len: the engine's, in tokens.
    """

    model_config: ModelConfig
    weights: SafetensorsWeights | RandomWeights | TensorWeights | None
    engine_config: EngineConfig
    dtype: torch.dtype
    max_model_len: int


class Worker:
    """One rank's model shard, KV cache and model runner.

    Args:
        spec: see WorkerSpec.
        tp: this rank's tensor-parallel group (SINGLE_RANK for a model on one device).
        device: this rank's device.
        model: the model, already loaded (one rank in the engine's process); None: built and
            loaded by `load_model`.
    """

    def __init__(self, spec: WorkerSpec, tp: TPGroup, device: torch.device,
                 model: torch.nn.Module | None = None) -> None:
        from pagedrt.kv.kv_cache import KVCacheSpec, resolve_kv_cache_dtype

        self.spec = spec
        self.tp = tp
        self.device = torch.device(device)
        self.model = model
        cfg = spec.engine_config
        kv_dtype = resolve_kv_cache_dtype(cfg.kv_cache_dtype, spec.dtype, self.device,
                                          cfg.attention_backend)  # ValueError: not here
        self.kv_spec = KVCacheSpec.for_model(spec.model_config, cfg.block_size, kv_dtype,
                                             tp.size)
        self.kv_cache = None
        self.model_runner = None
        self.draft = None  # speculative decoding's draft model (LoadedModel), if any
        self._launched: dict = {}  # step_id -> LaunchedStep not fetched yet

    @property
    def rank(self) -> int:
        return self.tp.rank

    # ------------------------------------------------------------ start-up
    def load_model(self) -> tuple[int, int]:
        """Build this rank's shard and load its weights (unless given); returns the number of
        KV blocks its budget holds (on CUDA, `gpu_memory_utilization` of its own device) and
        of CPU swap blocks (`swap_space_bytes`), both for its KV heads only."""
        from pagedrt.kv.kv_cache import num_blocks_for_budget
        from pagedrt.models.loader import build_model

        spec = self.spec
        if self.model is None:
            model = build_model(spec.model_config, spec.dtype, self.device, self.tp)
            model.load_weights(spec.weights.named_tensors(spec.dtype, self.device))
            self.model = model.eval()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        cfg = spec.engine_config
        num_blocks = num_blocks_for_budget(self.kv_spec, cfg, self.device)
        speculative = cfg.speculative
        if speculative is not None and speculative.method == "draft_model":
            num_blocks = self._load_draft(speculative.model, num_blocks)
        num_cpu_blocks = (cfg.swap_space_bytes // self.kv_spec.bytes_per_block
                          if cfg.preemption_mode == "swap" else 0)
        return num_blocks, num_cpu_blocks

    def _load_draft(self, model, num_blocks: int) -> int:
        """Load speculative decoding's draft model; returns the KV blocks left when the budget
        holds both caches, block for block (pagedrt/spec/draft_model.py: the draft's cache has
        as many blocks as the target's). Raises ValueError under tensor parallelism (the draft
        is not sharded) or for a draft that does not fit the target (vocabulary, length)."""
        from pagedrt.kv.kv_cache import KVCacheSpec
        from pagedrt.spec.draft_model import load_draft_model

        if self.tp.size != 1:
            raise ValueError("speculative decoding with a draft model needs "
                             f"tensor_parallel_size 1, not {self.tp.size}; use method 'ngram'")
        spec = self.spec
        self.draft = load_draft_model(model, spec.dtype, self.device, spec.model_config,
                                      spec.max_model_len)
        self.draft_kv_spec = KVCacheSpec.for_model(
            self.draft.model_config, spec.engine_config.block_size, spec.dtype)
        if spec.engine_config.num_kv_blocks is not None:
            return num_blocks
        target, draft = self.kv_spec.bytes_per_block, self.draft_kv_spec.bytes_per_block
        return max(num_blocks * target // (target + draft), 1)

    def init_device_side(self, num_blocks: int, num_cpu_blocks: int) -> None:
        """The KV cache of `num_blocks` blocks (and `num_cpu_blocks` swap blocks) and the model
        runner; on CUDA this warms up the GEMMs and captures the CUDA graphs, collectives
        included, in step with the other ranks."""
        from pagedrt.engine.model_runner import ModelRunner
        from pagedrt.kv.kv_cache import KVCache

        cfg = self.spec.engine_config
        self.kv_cache = KVCache(self.kv_spec, num_blocks, num_cpu_blocks, self.device,
                                cfg.attention_backend)
        speculative = cfg.speculative
        draft_proposer = None
        if self.draft is not None:
            from pagedrt.spec.draft_model import DraftModelProposer

            draft_proposer = DraftModelProposer(
                self.draft.model, KVCache(self.draft_kv_spec, num_blocks, 0, self.device,
                                          cfg.attention_backend),
                self.device, cfg.attention_backend)
        self.model_runner = ModelRunner(
            self.model, self.kv_cache, self.device, cfg.attention_backend,
            max_num_seqs=cfg.max_num_seqs, max_model_len=self.spec.max_model_len,
            use_cuda_graphs=not cfg.enforce_eager,
            max_num_batched_tokens=cfg.max_num_batched_tokens, seed=cfg.seed,
            num_speculative_tokens=speculative.num_speculative_tokens if speculative else 0,
            spec_max_num_seqs=speculative.disable_by_batch_size if speculative else 0,
            draft_proposer=draft_proposer, num_scheduler_steps=cfg.num_scheduler_steps)

    # ------------------------------------------------------------ steps
    def execute(self, plan: StepPlan) -> None:
        """Run the plan (see ModelRunner.execute); its launched step waits for `fetch`."""
        step = self.model_runner.execute(plan)
        if step is not None:
            self._launched[step.step_id] = step

    def fetch(self, step_id: int) -> StepResult:
        """The sampled tokens of a step run by `execute` (ModelRunner.fetch)."""
        return self.model_runner.fetch(self._launched.pop(step_id))

    def row_snapshot(self) -> dict[str, tuple[list[int], int, list[int]]]:
        """Every row's (token ids, num_computed_tokens, block ids), by request id (the
        engine's integrity check compares them with the host's requests)."""
        batch = self.model_runner.batch
        return {req_id: batch.row_view(req_id) for req_id in batch.row_of}


# ---------------------------------------------------------------- worker processes
def send(conn: Connection, message: tuple) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def error_message(rank: int, e: BaseException) -> tuple:
    """("error", rank, is_value_error, "rank R: Type: message", the whole traceback): the
    engine shows the short form (it may reach an HTTP client) and logs the traceback."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return ("error", rank, isinstance(e, ValueError), f"rank {rank}: {type(e).__name__}: {e}",
            text)


def serve(conn: Connection, tp: TPGroup, device: torch.device) -> int:
    """Answer the engine's commands until it says shutdown or goes away; returns the exit
    status (0, or 1 after an error, which was sent to the engine)."""
    worker: Worker | None = None
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return 0  # the engine is gone
        try:
            method, args, reply, seq = pickle.loads(data)
            if method == "shutdown":
                return 0
            if method == "init":
                worker, out = Worker(args[0], tp, device), None
            elif method == "release":
                worker = out = None
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            elif callable(method):  # Executor.collective_rpc with a function
                out = method(worker, *args)
            else:
                out = getattr(worker, method)(*args)
            if reply == ALL_REPLY or (reply == RANK0_REPLIES and tp.rank == 0):
                send(conn, ("ok", tp.rank, out, seq))
        except BaseException as e:  # noqa: BLE001 - reported to the engine, then exit
            try:
                send(conn, error_message(tp.rank, e))
            except OSError:
                pass
            return 1


def _exit_with_parent() -> None:
    """Exit this process within a second of its parent's death, whatever the main thread is
    blocked in (a collective with a rank that is gone, say)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="pagedrt-parent-watch", daemon=True).start()


def run_worker_process(rank: int, world_size: int, device: str, init_method: str,
                       conn: Connection) -> None:
    """Entry point of a worker process started by the engine (torch.multiprocessing, spawn):
    join the process group, then `serve`."""
    from pagedrt.entrypoints.cpu_threads import set_worker_threads

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle
    _exit_with_parent()
    dev = torch.device(device)
    # a spawned process starts with torch's default (a thread per core) again: on a CPU the
    # ranks share the cores out instead
    set_worker_threads(dev.type, world_size)
    if world_size == 1:  # the model in a process of its own, split over nothing: no group
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        tp = SINGLE_RANK
    else:
        try:
            tp = init_tp_group(rank, world_size, dev, init_method)
        except ProcessGroupError as e:
            send(conn, ("error", rank, True, str(e), ""))
            raise SystemExit(1) from None
    status = serve(conn, tp, dev)
    # nothing to flush or save: skip the interpreter's teardown (seconds for torch on a busy
    # machine), so that a shut-down engine's workers are gone at once
    os._exit(status)
