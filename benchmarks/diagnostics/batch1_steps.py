"""Why batch-1 ms/token varies between processes (issue 16): `pagedrt bench latency` gave
0.65 to 0.89 ms/token at ctx 512 from engines with the same tile choices (call s26call1),
while the in-step timing replayed the same decode graph at 0.56 ms. This runs the latency
loop (one greedy request, ctx 512, CUDA graphs, the Qwen2-0.5B preset with random weights)
several times in one process and prints each run's per-step wall times (median, p10, p90,
max), the host CPU time per step, the host's time per step by phase (the engine's StepClock
without a synchronize per phase; "update" includes the wait for the step before) and the CPUs
the loop ran on, and the same with Python's garbage collector off; then the machine's load and
CPU count. A one-off diagnostic, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/batch1_steps.py [--runs 6] [--steps 128]
        [--profile FILE]

--profile FILE: one more run under cProfile, the engine's functions by own time and by
cumulative time written to FILE (what the lent host spends its batch-1 step on, function by
function; the profiler's own cost inflates that run's figures).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import time

import torch

from pagedrt import LLM, SamplingParams
from pagedrt.bench.presets import get_preset, random_model
from pagedrt.engine.profiling import StepClock


def on_cpu() -> int:
    """The CPU this thread last ran on (/proc/thread-self/stat, field 39)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def one_run(engine, prompt: list[int], steps: int, tag: str) -> list[float]:
    """Per-step wall ms of `steps` decode steps after the prefill and the first token."""
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=steps + 1)
    engine.add_request(tag, prompt, params, stream=False)
    engine.step()
    torch.cuda.synchronize()
    walls, cpus = [], set()
    engine.clock = StepClock(torch.device("cpu"))  # host phases, no synchronize per phase
    engine.clock.enabled = True
    cpu0, t0 = time.process_time(), time.perf_counter()
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        walls.append(1e3 * (time.perf_counter() - t))
        cpus.add(on_cpu())
    torch.cuda.synchronize()
    total = 1e3 * (time.perf_counter() - t0) / len(walls)
    cpu = 1e3 * (time.process_time() - cpu0) / len(walls)
    q = statistics.quantiles(walls, n=10)
    print(f"{tag:10} ms/token {total:.3f}  step median {statistics.median(walls):.3f} "
          f"p10 {q[0]:.3f} p90 {q[-1]:.3f} max {max(walls):.3f}  host cpu/step {cpu:.3f}", flush=True)
    phases = " ".join(f"{k} {1e3 * v / len(walls):.3f}" for k, v in engine.clock.totals.items())
    print(f"{'':10} host ms/step by phase (no sync): {phases}; on cpus {sorted(cpus)}",
          flush=True)
    return walls


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--profile", default="")
    args = p.parse_args()
    model = random_model(get_preset("qwen2-0.5b"), torch.bfloat16, torch.device("cuda"))
    llm = LLM(model, gpu_memory_utilization=0.5, max_num_seqs=8,
              max_model_len=args.context + args.steps + 64)
    engine = llm.llm_engine
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 10000, (args.context,), generator=g).tolist()
    one_run(engine, prompt[:64], 16, "warm-up")
    print(f"process on cpus {sorted(os.sched_getaffinity(0))}", flush=True)
    for i in range(args.runs):
        one_run(engine, prompt, args.steps, f"run{i}")
    gc.disable()
    for i in range(2):
        one_run(engine, prompt, args.steps, f"nogc{i}")
    gc.enable()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        one_run(engine, prompt, args.steps, "profiled")
        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        buf.write(f"cProfile of one run of {args.steps} decode steps (ms are per run)\n")
        stats.sort_stats("tottime").print_stats(45)
        stats.sort_stats("cumulative").print_stats(45)
        with open(args.profile, "w") as f:
            f.write(buf.getvalue())
    print(f"loadavg {os.getloadavg()}; cpus {len(os.sched_getaffinity(0))}; "
          f"threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
