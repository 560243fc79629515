"""Timed config choices: `fastest_config` times candidate launch configs of an op against its
plain path, replayed from CUDA graphs with a cold L2, and records what it timed for the
in-step timing (`step_candidates`, `recording_use`, pagedrt/engine/step_timing.py); under
PAGEDRT_WARM_SHARD it only compiles its share of the candidates (a cache-warming process).
Used by the skinny matmul (gemv_triton.py), the decode matmul and its epilogues
(matmul_triton.py, matmul_rope_triton.py). docs/design.md, "Small-batch decode"."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from pagedrt.env_flags import env_flag
from pagedrt.ops import config_cache
from pagedrt.ops.triton_utils import num_sms, pdl_enabled, pdl_launch, pdl_prologue

# PAGEDRT_COLD_L2_TIMING=0: time configs with warm caches, as before 2026-12-04
COLD_L2_TIMING = env_flag("PAGEDRT_COLD_L2_TIMING")
# PAGEDRT_TIMING_LEAD=1: a PDL lead kernel before each timed call (`_pdl_lead`); off by
# default until measured across batch sizes (benchmarks/results/RUNS.md, "Runs of 2026-12-04
# (20:40-21:35 UTC)")
TIMING_LEAD = env_flag("PAGEDRT_TIMING_LEAD")
LEAD_ITERS = 600  # the lead kernel's dependent FMAs per program: about 2 us on an H200


def warm_shard(value: str | None) -> tuple[int, int] | None:
    """PAGEDRT_WARM_SHARD's (i, n) from "i/n" (0 <= i < n), or None where unset or blank: the
    process only compiles its share of the timed configs (`fastest_config`).

    Raises:
        ValueError: not "i/n" with 0 <= i < n; names the value and the form expected.
    """
    value = (value or "").strip()
    if not value:
        return None
    i, _, n = value.partition("/")
    if not (i.isdigit() and n.isdigit() and int(i) < int(n)):
        raise ValueError(f"PAGEDRT_WARM_SHARD={value!r}: expected i/n with 0 <= i < n "
                         f"(e.g. 3/8), or unset")
    return int(i), int(n)


def timing_rep_ms(rep: float, value: str | None) -> float:
    """The replay time (ms) `fastest_config` spends on each timed config: `rep`, the op's own,
    or less where PAGEDRT_TIMING_REP_MS (`value`) caps it. Each config costs about ten such
    replays plus a capture, so an engine's start-up timing scales with it: the GPU tests cap
    it at 2 ms (tests/gpu/conftest.py), where tiny models' engines timed at 10-20 ms ran for
    minutes per engine with four test processes on one GPU (benchmarks/results/RUNS.md, "Runs
    of 2026-12-06 (05:22-05:51 UTC)"). A short replay times noisily, so a capped engine may
    choose other tiles than an uncapped one: leave it unset for serving and benchmarks.

    Raises:
        ValueError: a value that is not a positive number of milliseconds; names it.
    """
    if value is None or not value.strip():
        return rep
    try:
        cap = float(value)
    except ValueError:
        cap = -1.0
    if not cap > 0:
        raise ValueError(f"PAGEDRT_TIMING_REP_MS={value!r}: give a positive number of "
                         "milliseconds (e.g. 2), or leave it unset for each op's own")
    return min(rep, cap)


# PAGEDRT_WARM_SHARD=i/n: a cache-warming process, one of n run side by side on a fresh
# machine before the real run (benchmarks/diagnostics/call_common.sh, `warm_cache`): each
# compiles only every n-th candidate config (from the i-th) of every timed choice and times
# none (docs/design.md, "Small-batch decode": compiling on a fresh machine)
WARM_SHARD = warm_shard(os.environ.get("PAGEDRT_WARM_SHARD"))


@triton.jit
def _lead_kernel(x_ptr, iters, PDL: tl.constexpr):
    """Waits for the kernel before it (PDL), lets the next one launch, then runs `iters`
    dependent FMAs per program and stores the result (so that they are not optimized away)."""
    pdl_prologue(PDL)
    x = tl.load(x_ptr + tl.program_id(0))
    for _ in range(iters):
        x = x * 0.999 + 0.001
    tl.store(x_ptr + tl.program_id(0), x)


def _pdl_lead() -> Callable[[], None] | None:
    """A function launching a short kernel (one one-warp program per SM, about 2 us) with
    programmatic dependent launch, or None unless PAGEDRT_TIMING_LEAD=1 (`TIMING_LEAD`) and
    PDL is on (`pdl_enabled`). In a decode step each kernel's programs become resident while
    the kernel before it still runs and load their first weights before their wait
    (`pdl_prologue`); a kernel timed right after the L2 flush, which launches no dependents,
    gets none of that head start. After this lead a candidate gets it as in a step. The
    motivation: the batch-1 gate/up tile the timing picked without it was 3% slower per decode
    step than one it passed over (benchmarks/results/RUNS.md, "Runs of 2026-12-04 (20:40-21:35
    UTC)"); that the lead picks better tiles is not yet shown, hence off by default."""
    if not TIMING_LEAD:
        return None
    buf = torch.zeros(num_sms(torch.cuda.current_device()), dtype=torch.float32, device="cuda")
    if not pdl_enabled(buf):
        return None

    def lead() -> None:
        _lead_kernel[(buf.numel(),)](buf, LEAD_ITERS, num_warps=1, **pdl_launch(True))
    return lead


def _l2_flusher() -> Callable[[], torch.Tensor]:
    """A function that reads twice the current device's L2 size of other data (64 MB if
    torch does not report the size), so that the next kernel's weights come from HBM as they
    do in a decode step (a step's weights are many times the L2). Its buffer lives as long as
    the function: one `fastest_config` call, not the engine's lifetime."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2_bytes = getattr(props, "L2_cache_size", 0) or (32 << 20)
    return torch.zeros(2 * l2_bytes // 4, dtype=torch.float32, device="cuda").sum


@dataclasses.dataclass
class TimingTotals:
    """What `fastest_config` did in this process so far: choices timed and the configs
    (baselines included) timed for them, the wall seconds that took (a choice timed inside
    another's baseline counted once), and choices read from the config cache's file. The
    engine logs them after its graph capture and `pagedrt bench throughput` reports them."""

    choices_timed: int = 0
    configs_timed: int = 0
    seconds: float = 0.0
    choices_read: int = 0

    def summary(self) -> str:
        """One phrase for the engine's log and the benchmarks' start-up line."""
        return (f"{self.choices_timed} choices timed ({self.configs_timed} configs) in "
                f"{self.seconds:.1f} s, {self.choices_read} read from the config cache")


TOTALS = TimingTotals()
CLEAR_WIN = 0.95  # a config replaces the best so far only below this fraction of its time
_DEPTH = 0  # fastest_config calls timing now (one nests in another's baseline)


# (id of a choice table, key) -> (the table, rows, {config or None: ms per call timed alone}):
# what `fastest_config` timed for each op, for the in-step timing (`step_candidates`)
TIMED: dict[tuple, tuple[dict, int, dict]] = {}


_USED: set | None = None  # while `recording_use` holds it: (id(table), key) of every lookup


def note_use(table: dict, key: tuple) -> None:
    """Called by the ops on every look-up of a timed choice: files it while `recording_use`
    is active (cheap otherwise)."""
    if _USED is not None:
        _USED.add((id(table), key))


@contextlib.contextmanager
def recording_use():
    """Yields the set of (id(table), key) the ops look up while held: which timed ops a
    forward pass runs as the tables stand (a fused op that keeps its fused config never runs
    the plain op inside its unfused chain)."""
    global _USED
    previous, _USED = _USED, set()
    try:
        yield _USED
    finally:
        _USED = previous


def step_candidates(rows: int, margin: float = 0.10, limit: int = 4
                    ) -> list[tuple[dict, tuple, list]]:
    """For every op timed at `rows` rows (`fastest_config`'s `record`): (its choice table, its
    key, the configs worth timing inside a decode step), the configs being the `limit` fastest
    of those timed alone within `margin` of the fastest (None: the op's plain path), the
    table's current choice always among them; ops with one such config are left out. Ordered
    by the weight's size, largest first. Used by the in-step timing
    (pagedrt/engine/step_timing.py, docs/design.md "Small-batch decode")."""
    out = []
    for table, key, key_rows, times in ((t, k, r, ms) for (_, k), (t, r, ms) in TIMED.items()):
        if key_rows != rows or key not in table or not times:
            continue
        best_ms = min(times.values())  # (a cold-L2 time less the flush's may be <= 0)
        configs = [c for c in sorted(times, key=times.get)
                   if times[c] <= best_ms + abs(best_ms) * margin][:limit]
        if table[key] not in configs:
            configs = [table[key]] + configs[: limit - 1]
        if len(configs) > 1:
            out.append((table, key, configs))
    return sorted(out, key=lambda c: -_weight_numel(c[1]))


def key_shape_index(key: tuple) -> int | None:
    """Where the weight's shape lies in a choice key (its first tuple: gemv_triton's and
    matmul_triton's keys are (shape, rows, ...) or (op name, shape, rows, ...)); None if
    it has none."""
    return next((i for i, k in enumerate(key) if isinstance(k, tuple | torch.Size)), None)


def _weight_numel(key: tuple) -> int:
    """The weight's element count from a choice key (`key_shape_index`)."""
    shape = key[key_shape_index(key)]
    return int(shape[0]) * int(shape[1])


def fastest_config(baseline, candidate, configs, rep: int, record: tuple | None = None,
                   baseline_margin: float = CLEAR_WIN) -> tuple | None:
    """Of `configs` (iterated after `baseline` has run), the config for which
    `candidate(config)` beats `baseline()` (and every earlier winner) by 5%, or None; against
    the baseline, "beats" means a time below baseline_margin times the baseline's. With
    `record` = (choice table, key, rows), every timed config's ms per call (the baseline's
    under None) is filed in `TIMED` for the in-step timing, which may revisit the choice
    (`step_candidates`, pagedrt/engine/step_timing.py). Timed as
    the engine runs them: replayed from a CUDA graph (triton.testing.do_bench_cudagraph),
    where launch overhead does not hide the kernels' own time; each is run once first,
    outside the capture, to compile it. A config the GPU cannot run is skipped. Used by the
    skinny matmul (gemv_triton.py) and the decode matmul (matmul_triton.py).

    Each call is timed after an L2 flush (`_l2_flusher`), and with PAGEDRT_TIMING_LEAD=1 a
    short PDL lead kernel after it (`_pdl_lead`; off by default), their own time subtracted:
    replayed back to back, a weight of up to tens of MB stays in the H200's 50 MB L2 and
    reads at L2 latency, which favours tiles with few loads in flight that starve on HBM
    (the engine's steps read every weight from HBM); the lead lets a kernel launched with PDL
    load its weights before its wait, as it does in a step. PAGEDRT_COLD_L2_TIMING=0 times
    warm, with neither.

    Only OutOfResources (too much shared memory or too many registers for this GPU) skips a
    config; any other error, a compilation error above all, propagates: a kernel that does not
    compile is a bug to see, not a config to pass over (a Triton-version incompatibility once
    went unseen that way: every candidate failed and the baseline won).

    `rep` is the replay time per config in ms, at most PAGEDRT_TIMING_REP_MS where that is
    set (`timing_rep_ms`). Unless PAGEDRT_CONFIG_CACHE is off, a `record`ed choice that an
    earlier process timed under the same fingerprint is taken from the config cache's file
    without timing (its times filed in `TIMED` as if timed here), and a new one is appended
    to it (pagedrt/ops/config_cache.py). Under PAGEDRT_WARM_SHARD=i/n (`WARM_SHARD`) nothing is
    timed, nor read from or written to that file: `_warm_only` compiles this process's share
    of `configs` and the baseline is returned."""
    if WARM_SHARD is not None:
        return _warm_only(baseline, candidate, configs, *WARM_SHARD)
    disk = config_cache.cache_for(record[0]) if record is not None else None
    if disk is not None:
        stored = disk[0].lookup(disk[1], record[1])
        if stored is not None:  # timed by an earlier process (the config cache)
            config, stored_times, rows = stored
            TIMED[id(record[0]), record[1]] = (record[0], rows, dict(stored_times))
            TOTALS.choices_read += 1
            return config
    rep = timing_rep_ms(rep, os.environ.get("PAGEDRT_TIMING_REP_MS"))
    global _DEPTH
    start, _DEPTH = time.perf_counter(), _DEPTH + 1
    try:
        best, times = _time_configs(baseline, candidate, configs, rep, record,
                                    baseline_margin)
    finally:
        _DEPTH -= 1
        if _DEPTH == 0:  # (a choice timed inside another's baseline counts once)
            TOTALS.seconds += time.perf_counter() - start
    TOTALS.choices_timed += 1
    TOTALS.configs_timed += len(times)
    if disk is not None:
        disk[0].store(disk[1], record[1], best, times, record[2])
    return best


def _time_configs(baseline, candidate, configs, rep: float, record: tuple | None,
                  baseline_margin: float = CLEAR_WIN) -> tuple[tuple | None, dict]:
    """`fastest_config`'s timing: (the winning config or None, {config or None: ms})."""
    from triton.testing import do_bench_cudagraph

    def bench(fn) -> float:
        # do_bench_cudagraph runs fn on a stream of its own, unordered with this one: nothing
        # may still run here then, since the split-K matmuls and the fused reduce count on
        # shared arrival counters (pagedrt/ops/matmul_triton.py), which two launches at once
        # would leave nonzero
        torch.cuda.synchronize()
        fn()
        torch.cuda.synchronize()
        ms = do_bench_cudagraph(fn, rep=rep)
        torch.cuda.synchronize()
        return ms

    if COLD_L2_TIMING:
        flush, lead = _l2_flusher(), _pdl_lead()

        def before() -> None:  # what runs before each timed call; its time is subtracted
            flush()
            if lead is not None:
                lead()
        before_ms = bench(before)

    def timed(fn) -> float:
        if not COLD_L2_TIMING:
            return bench(fn)

        def flushed():
            before()
            return fn()
        return bench(flushed) - before_ms

    times: dict = {}
    if record is not None:
        table, key, rows = record
        TIMED[id(table), key] = (table, rows, times)
    best, best_ms = None, timed(baseline)
    times[None] = best_ms
    for cfg in configs:
        try:
            ms = timed(lambda cfg=cfg: candidate(cfg))
        except OutOfResources:  # a config this GPU cannot run
            continue
        times[cfg] = ms
        # a clear win only (over the baseline: baseline_margin)
        if ms < (baseline_margin if best is None else CLEAR_WIN) * best_ms:
            best, best_ms = cfg, ms
    return best, times


def _warm_only(baseline, candidate, configs, shard: int, shards: int) -> None:
    """`fastest_config` in a cache-warming process (PAGEDRT_WARM_SHARD=shard/shards): runs
    `baseline()` (which may make a choice that `configs` reads) and then `candidate(config)`
    once for every `shards`-th config from the `shard`-th, so that Triton compiles them into
    its on-disk cache, and returns None (the baseline): nothing is timed. A config the GPU
    cannot run is skipped, as when timing."""
    baseline()
    for j, cfg in enumerate(configs):
        if j % shards != shard:
            continue
        try:
            candidate(cfg)
        except OutOfResources:
            continue
