"""Why the first timed run at a batch size is slower than the next ones (issue 16).

`pagedrt bench throughput --batch-sizes 8,32,64,128 --repeats 3` times each batch size three
times in one engine, after a warm-up at that batch size (8 output tokens a request), and the
first run at 32, 64 and 128 requests was the slow one in every sweep with per-run figures
(benchmarks/results/RUNS.md, "Runs of 2026-12-05 (21:40-22:15 UTC)": 40.5k against 50.0k and
51.2k tok/s at 64 on an H100; 34.2k against 43.1k and 45.1k on an H200 on 2026-12-04), while
256 and 8 requests were not. Found on the CPU with this script: the repeats drew the token ids
of the workload's own repeats and hit the prefix cache (`pagedrt.bench.throughput.fresh_seed`
gives every run its own ids since). With `--old-seeds` the runs take the seeds of before
(1001, 1002, ... for every batch size); each run's prefix-cache hits are printed.

This repeats that sequence (the bench's own workload, warm-up and timed runs) and, per run,
counts what else a first run could pay for that later ones do not: Triton kernels compiled or
loaded (`triton.knobs.runtime.jit_post_compile_hook`: a launch whose specialization, e.g. an
int argument's divisibility by 16 or a pointer's alignment, this process had not launched
before), the caching allocator's cudaMalloc calls (each synchronizes) and allocation
retries, and Python's garbage collections with their time; and prints its slowest steps
with what they scheduled. A one-off diagnostic, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/first_run.py [--batch-sizes 32,64,128]
        [--runs 3] [--preset qwen2-0.5b] [--input-len 512] [--output-len 128] [--old-seeds]
        [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

from benchmarks.profile_host import alloc_counters
from pagedrt.bench.common import add_model_args, int_list, load, make_llm
from pagedrt.bench.throughput import (
    fresh_seed,
    make_workload,
    timed_generate,
    trace_steps,
    warm_up,
)


class Watch:
    """Counts, between `start` and `stop`, Triton compiles (by kernel name), the caching
    allocator's cudaMalloc calls and allocation retries (`profile_host.alloc_counters`) and
    garbage collections (count, ms)."""

    def __init__(self):
        self.compiles: list[str] = []
        self.gc_ms: list[float] = []
        self._gc_start = 0.0
        self._on = False
        self._stats0: dict = {}
        import triton

        self._knobs = getattr(triton, "knobs", None)
        if self._knobs is not None:
            self._knobs.runtime.jit_post_compile_hook = self._compiled
        gc.callbacks.append(self._gc)

    def _compiled(self, *, fn, **_) -> bool:
        if self._on:
            self.compiles.append(getattr(fn, "name", str(fn)))
        return False

    def _gc(self, phase: str, info: dict) -> None:
        if not self._on:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_ms.append(1e3 * (time.perf_counter() - self._gc_start))

    def start(self) -> None:
        self.compiles, self.gc_ms = [], []
        self._stats0 = alloc_counters()
        self._on = True

    def stop(self) -> dict:
        self._on = False
        now = alloc_counters()
        return {"compiles": len(self.compiles),
                "compiled": sorted(set(self.compiles)),
                "cuda_mallocs": now["num_device_alloc"] - self._stats0["num_device_alloc"],
                "alloc_retries": now["num_alloc_retries"] - self._stats0["num_alloc_retries"],
                "gc_collections": len(self.gc_ms), "gc_ms": round(sum(self.gc_ms), 2)}


def timed_run(llm, args, seed: int, watch: Watch) -> dict:
    """One run of `args`' workload on token ids of `seed`: seconds, output tok/s, what
    `Watch` counted and the five slowest steps (ms, requests and tokens scheduled)."""
    prompts, params, _ = make_workload(args, seed=seed)
    engine = llm.llm_engine
    hits = engine.stats(detailed=False)["prefix_cache_hits"]
    trace, finish = trace_steps(engine)
    watch.start()
    seconds, _, outs = timed_generate(llm, prompts, params)
    counted = watch.stop()
    counted["prefix_cache_hits"] = engine.stats(detailed=False)["prefix_cache_hits"] - hits
    finish()
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = [(1e3 * row[0], row[1], row[2]) for row in trace]
    slow = sorted(steps, reverse=True)[:5]
    return {"seed": seed, "seconds": round(seconds, 4), "output_tok_s": round(n_out / seconds),
            "steps": len(steps), "step_ms_median": round(statistics.median(s[0] for s in steps), 3),
            "slowest_steps": [(round(ms, 2), reqs, toks) for ms, reqs, toks in slow], **counted}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--batch-sizes", type=int_list, default=int_list("32,64,128"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--old-seeds", action="store_true",
                   help="the repeats' seeds of before the fix (1001, 1002, ...)")
    args = p.parse_args()
    args.workload, args.sampling, args.tokenizer = "fixed", "", None
    args.warm_up_requests = None
    model, _ = load(args)
    llm = make_llm(model, args)
    watch = Watch()
    results = []
    for b in args.batch_sizes:
        sub = argparse.Namespace(**{**vars(args), "num_requests": b})
        watch.start()
        warm_up(llm, sub)  # as `pagedrt bench throughput` does before a batch size's runs
        warm = watch.stop()
        print(f"batch {b}: warm-up compiled {warm['compiles']}, cudaMalloc "
              f"{warm['cuda_mallocs']}", flush=True)
        for r in range(args.runs):  # the bench's seeds: 100 + b first, then fresh_seed's
            seed = 100 + b if r == 0 else 1000 + r if args.old_seeds else fresh_seed(r, b)
            run = timed_run(llm, sub, seed, watch)
            run["batch"], run["run"] = b, r + 1
            results.append(run)
            print(f"  run {r + 1}: {run['output_tok_s']:,} tok/s, {run['steps']} steps "
                  f"(median {run['step_ms_median']} ms), prefix-cache hits "
                  f"{run['prefix_cache_hits']}, compiles {run['compiles']} "
                  f"{run['compiled'][:6]}, cudaMalloc {run['cuda_mallocs']}, retries "
                  f"{run['alloc_retries']}, gc {run['gc_collections']} ({run['gc_ms']} ms); "
                  f"slowest steps (ms, requests, tokens) {run['slowest_steps']}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "first_run.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
