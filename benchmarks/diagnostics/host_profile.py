"""Where the host's time goes in a `bench throughput` workload on the GPU machine: cProfile
over one whole timed run (after a warm-up run in the same engine), the engine's own functions
by own time and by cumulative time, and the StepClock's phases per step. Issue 16's host work:
on the H200's host a 256-row decode step of the nano-vllm workload took 2.4 ms of host time
against 1.9 ms on the device, and this CPU's `benchmarks/host_step_cpu.py` (a stub model)
does not show what CUDA launches and copies cost there. A one-off diagnostic, not a benchmark.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/host_profile.py --workload nanovllm \
        --out DIR [--rows 45]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch

from pagedrt.bench.common import add_model_args, load, make_llm
from pagedrt.bench.throughput import make_workload, warm_up


def main() -> None:
    p = argparse.ArgumentParser()
    add_model_args(p)
    p.add_argument("--workload", default="nanovllm", choices=["fixed", "nanovllm"])
    p.add_argument("--sampling", default="")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--warm-up-requests", type=int, default=None)
    p.add_argument("--rows", type=int, default=45)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model, name = load(args)
    llm = make_llm(model, args)
    warm_up(llm, args)
    prompts, params, workload = make_workload(args, seed=1)
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)  # untimed, unprofiled: steady state
    plain_s = time.perf_counter() - t
    prompts, params, _ = make_workload(args, seed=2)
    engine = llm.llm_engine
    engine.clock.reset()
    steps_before = engine.counters["num_steps"]
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    outs = llm.generate(prompts, params, use_tqdm=False)
    prof.disable()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    profiled_s = time.perf_counter() - t
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = engine.counters["num_steps"] - steps_before
    buf = io.StringIO()
    buf.write(f"{name} {workload}: {tokens} tokens, unprofiled run {plain_s:.3f} s "
              f"({tokens / plain_s:,.0f} tok/s), profiled {profiled_s:.3f} s\n")
    buf.write("StepClock totals (s): " + " ".join(
        f"{k} {v:.3f}" for k, v in engine.clock.totals.items()) + f"; {steps} steps\n")
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(args.rows)
    stats.sort_stats("cumtime").print_stats("pagedrt", args.rows)
    text = buf.getvalue()
    with open(os.path.join(args.out, f"host_profile_{name}_{args.workload}.txt"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
