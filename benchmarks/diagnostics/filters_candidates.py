"""Time the sampler's draw for rows with top-k, top-p and min-p (the `--sampling filters`
setting of `pagedrt bench throughput`: temperature 0.8, top-k 50, top-p 0.9, min-p 0.05) two
ways on the same logits and noise: over the full [B, vocab] rows, and among each row's k_max
candidates (`_sample_candidates`, what `Sampler.sample_rows` takes when every sampled row has a
top-k). Checks the tokens agree. A diagnostic for issue 16 (the filters' decode step took
3.44 ms on the H200 against greedy's 1.87, benchmarks/results/RUNS.md, "Runs of 2026-12-02
(08:30-09:00 UTC)"), not a benchmark.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/filters_candidates.py [--rows 256]
        [--vocab 151936] [--device cuda|cpu] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from pagedrt.engine.sampler import _sample_filtered
from pagedrt.engine.sampling_state import GREEDY, MIN_P, NUM_PARAMS, TEMPERATURE, TOP_K, TOP_P


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    device = torch.device(args.device)
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, generator=g, device=device) * 3
    params = torch.zeros(args.rows, NUM_PARAMS, device=device)
    params[:, TEMPERATURE], params[:, TOP_K], params[:, TOP_P] = 0.8, 50, 0.9
    params[:, MIN_P], params[:, GREEDY] = 0.05, 0
    host_k = np.full(args.rows, 50)
    host_p = np.full(args.rows, 0.9)
    results = {}
    for name, greedy in (("full rows", True), ("candidates", False)):
        # host_greedy all True sends every row down the full-row path (its draw is the same)
        host_greedy = np.full(args.rows, greedy)
        times, tokens = [], None
        for i in range(args.iters + 3):
            gen = torch.Generator(device=device).manual_seed(i)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = _sample_filtered(logits, params, host_k, host_p, host_greedy, True, True, [],
                                   False, gen)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                times.append(1e3 * (time.perf_counter() - t))
            if i == 3:
                tokens = out
        results[name] = (statistics.median(times), tokens)
    same = torch.equal(results["full rows"][1], results["candidates"][1])
    for name, (ms, _) in results.items():
        print(f"{name:11s} {ms:8.3f} ms  ({args.rows} x {args.vocab}, {args.device})")
    print(f"tokens equal: {same}")


if __name__ == "__main__":
    main()
