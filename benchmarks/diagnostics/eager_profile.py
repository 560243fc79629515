"""Where the host time of an eager (no CUDA graph) forward goes: batch-1 decode steps and one
16,384-token prefill of the Qwen2-0.5B preset under cProfile, the functions by own time, and
the host-device synchronizations inside those steps (CUDA sync debug mode). A one-off
diagnostic for the eager-path host cost seen on 2026-12-01 (batch-1 eager 32.6 ms/token at
3f41031 against 12.8 at 9f28017), not a benchmark.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/eager_profile.py [--preset P] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
import warnings

import torch

from pagedrt import SamplingParams
from pagedrt.bench.common import add_model_args, load, make_llm


def main() -> None:
    p = argparse.ArgumentParser()
    add_model_args(p)  # (--preset qwen2-0.5b, --out, the engine options)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cuda = torch.cuda.is_available()
    model, _ = load(args)
    llm = make_llm(model, args, enforce_eager=True)
    one = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    prompt = [[i % 1000 + 1 for i in range(512)]]
    prefill = [[(i * 7 + j) % 5000 + 1 for j in range(512)] for i in range(32)]
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate(prompt, one, use_tqdm=False)  # warm: compile, choose kernels
    llm.generate(prefill, first, use_tqdm=False)
    report = []
    for name, prompts, params in (("batch-1 decode, 64 tokens", prompt, one),
                                  ("prefill 32 x 512", [[t + 1 for t in x] for x in prefill],
                                   first)):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        prof = cProfile.Profile()
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prof.enable()
            llm.generate(prompts, params, use_tqdm=False)
            prof.disable()
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        syncs = [str(w.message)[:160] for w in caught if "synchron" in str(w.message)]
        report.append(f"== {name}: {wall * 1e3:.1f} ms wall (unprofiled); {len(syncs)} syncs\n"
                      + "\n".join(sorted(set(syncs))[:10]) + "\n" + buf.getvalue())
    text = "\n".join(report)
    with open(os.path.join(args.out, "eager_profile.txt"), "w") as f:
        f.write(text)
    print(text[:12000])


if __name__ == "__main__":
    main()
