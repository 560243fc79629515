"""In-step timing of the decode ops' tile configs (docs/design.md, "Small-batch decode").

The start-up timing (`config_timing.fastest_config`) times each op alone, replayed from a CUDA
graph after an L2 flush. In a decode step each kernel also overlaps the one before it (its
programs load weights before their PDL wait), which timing alone does not see: on the H200 the
batch-1 RMSNorm + gate/up tile chosen alone was 3% slower per step than one it passed over, and
which of the close tiles won alone changed between start-ups (benchmarks/results/RUNS.md,
"Runs of 2026-12-04 (20:40-21:35 UTC)"). So, for the decode-graph batch sizes listed in
PAGEDRT_STEP_TIMING (`BUCKETS`: "1" for batch 1, "1,8,32" for several), where several
configs of an op of that many rows time within 10% of the fastest alone
(`config_timing.step_candidates`: the 1-4-row skinny matmul and its fused ops, the 8-128-row
matmul and its epilogues), the graph runner captures that batch's
decode graph once per such config (every other op as chosen) and replays the graphs in
alternating rounds; the config of the fastest graph replaces the one chosen alone if its step
is `MIN_GAIN` faster. One op at a time, largest weight first, each later op timed with the
earlier ones' new choices (coordinate descent). Off by default until measured on the GPU.

Not under tensor parallelism: each rank's candidates come from its own timing, so the ranks
would capture different numbers of graphs, each holding all-reduces.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass


def parse_buckets(value: str | None) -> frozenset[int]:
    """PAGEDRT_STEP_TIMING: the decode-graph batch sizes whose ops are timed in a step, as a
    comma-separated list ("1" is batch 1 alone; "1,8,32,64"); unset, empty or "0": none.

    Raises:
        ValueError: anything but positive integers separated by commas.
    """
    if value is None or value.strip() in ("", "0"):
        return frozenset()
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"PAGEDRT_STEP_TIMING={value!r}: give the decode batch sizes to time "
                         "in a step, comma-separated (e.g. 1 or 1,8,32), or 0 for none")
    return frozenset(int(p) for p in parts)


BUCKETS = parse_buckets(os.environ.get("PAGEDRT_STEP_TIMING"))
ROUNDS = 3  # rounds over an op's graphs, alternating their order (drift shows in both)
REPLAYS = 20  # graph replays per timing; a replay is one decode step
MIN_GAIN = 0.003  # a config replaces the one chosen alone only if its step is 0.3% faster
MARGIN = 0.10  # configs within this of the fastest alone are timed in a step
LIMIT = 4  # at most this many configs per op (the fastest alone)
CONTEXT = 512  # tokens each timed step attends to (fewer where the block table is shorter)

_DONE: set[tuple] = set()  # (id(table), key) timed in a step in this process (tables: per process)


@dataclass
class StepChoice:
    """What the in-step timing found for one op: its choice table key, the config chosen
    alone, the config kept, and each timed config's median ms per decode step."""

    key: tuple
    chosen_alone: object
    chosen: object
    step_ms: dict


def refine(candidates: list[tuple[dict, tuple, list]], capture: Callable[[], object],
           time_graph: Callable[[object], float], rounds: int = ROUNDS,
           used: Callable[[], set] | None = None) -> list[StepChoice]:
    """Time each candidate config of each op inside a whole step and keep the fastest.

    Args:
        candidates: (choice table, key, configs) per op, as `config_timing.step_candidates`
            gives them; `table[key]` is set to each config in turn and left at the one kept.
        capture: captures a decode graph with the tables as they are now; returns a handle
            that `time_graph` accepts (kept alive until the op's timing ends).
        time_graph: ms per replay of a captured graph.
        rounds: rounds over an op's graphs; odd rounds go in reverse order.
        used: the (id(table), key) of the ops a step runs as the tables stand now
            (`config_timing.recording_use` over a forward pass); asked before each op, which is
            skipped if the step does not run it (the plain op inside a fused op's unfused
            chain, once the fused op keeps a fused config: its graphs would all be the same).

    Returns:
        One StepChoice per op timed (ops already timed in this process are skipped).
    """
    report = []
    for table, key, configs in candidates:
        if (id(table), key) in _DONE or (used is not None and (id(table), key) not in used()):
            continue
        incumbent = table[key]
        try:
            graphs = {}
            for cfg in configs:
                table[key] = cfg
                graphs[cfg] = capture()
            samples: dict = {cfg: [] for cfg in configs}
            for r in range(rounds):
                for cfg in configs if r % 2 == 0 else configs[::-1]:
                    samples[cfg].append(time_graph(graphs[cfg]))
        finally:
            table[key] = incumbent
            graphs = None  # the op's graphs go before the next op's are captured
        step_ms = {cfg: statistics.median(v) for cfg, v in samples.items()}
        best = min(configs, key=step_ms.get)
        if step_ms[best] > step_ms[incumbent] * (1 - MIN_GAIN):
            best = incumbent
        table[key] = best
        _DONE.add((id(table), key))
        report.append(StepChoice(key, incumbent, best, step_ms))
    REPORT.extend(report)
    return report


REPORT: list[StepChoice] = []  # every op timed in a step in this process, in order


def report_dict() -> dict:
    """REPORT as plain data for a benchmark's JSON: {str(key): {"alone": config, "kept":
    config, "step_ms": {str(config): ms per step}}}, configs as lists, None the plain path."""
    def plain(cfg):
        return None if cfg is None else list(cfg)
    return {str(c.key): {"alone": plain(c.chosen_alone), "kept": plain(c.chosen),
                         "step_ms": {str(plain(cfg)): round(ms, 5)
                                     for cfg, ms in c.step_ms.items()}}
            for c in REPORT}
