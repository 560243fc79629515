"""Device time of the 1-4-row skinny matmul with its prologues (pagedrt/ops/gemv_triton.py:
the RMSNorm before QKV and gate/up, SwiGLU's activation before down) against the chains they
replace, each fused candidate of `gemv_triton.CONFIGS`, and which of them the engine's
start-up timing tries (`fused_or_unfused`: the plain matmul's own choice and FUSED_DEFAULT).
Replayed from CUDA graphs (triton.testing.do_bench_cudagraph), hot L2 as the start-up timing
sees them. Issue 16: the batch-1 profile of 2026-12-04 (benchmarks/results/RUNS.md, "Runs of
2026-12-04 (06:15-06:55 UTC)") found the RMSNorm and the activation still launched as kernels
of their own at Qwen2-0.5B's batch 1, i.e. every fused candidate tried there lost by the
timing's 5% margin. A one-off diagnostic.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/prologue_times.py [--rows 1,2,4]
        [--shapes qwen2-0.5b,llama3-8b]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from pagedrt.ops.fused_triton import rms_norm_triton, silu_and_mul_triton
from pagedrt.ops.gemv_triton import (
    CONFIGS,
    FUSED_DEFAULT,
    gemv_rmsnorm_triton,
    gemv_silu_mul_triton,
    gemv_triton,
)

DEVICE = "cuda"
# hidden, QKV rows, intermediate; QKV with a bias as Qwen2's
SHAPES = {"qwen2-0.5b": (896, 1152, 4864, True), "llama3-8b": (4096, 6144, 14336, False)}


def timed(fn) -> float:
    """us per call, from a CUDA graph replay."""
    fn()
    torch.cuda.synchronize()
    us = 1e3 * do_bench_cudagraph(fn, rep=20)
    torch.cuda.synchronize()
    return us


def best(fns: dict) -> tuple:
    """(config, us) of the fastest of {config: fn}, and {config: us}."""
    us = {c: timed(fn) for c, fn in fns.items()}
    c = min(us, key=us.get)
    return c, us[c], us


def op_row(name: str, m: int, cublas_us: float, plain: dict, chain_rest, fused: dict) -> str:
    """One table line: cuBLAS, the best plain skinny config, the chain (the other kernel + the
    best plain config), the best fused config, and the best of the two the engine tries."""
    plain_cfg, plain_us, _ = best(plain)
    chain_us = timed(lambda: chain_rest(plain_cfg))
    fused_cfg, fused_us, all_us = best(fused)
    tried = {c: all_us[c] for c in dict.fromkeys((plain_cfg, FUSED_DEFAULT))}
    tried_cfg = min(tried, key=tried.get)
    win = "fused" if tried[tried_cfg] < 0.95 * chain_us else "chain"
    return (f"{name:22} {m:2d} {cublas_us:7.2f} {plain_us:7.2f} {chain_us:8.2f} "
            f"{fused_us:7.2f} {fused_cfg!s:>14} {tried[tried_cfg]:7.2f} "
            f"{tried_cfg!s:>14} {win:>6}")


def shape_rows(shape: str, m: int) -> None:
    """The three fused ops of one model shape at m rows, one line each."""
    dev, bf16 = DEVICE, torch.bfloat16
    hidden, qkv, inter, qkv_bias = SHAPES[shape]
    nw = (1 + 0.1 * torch.randn(hidden, device=dev)).to(bf16)
    x = torch.randn(m, hidden, device=dev).to(bf16)
    res = torch.randn(m, hidden, device=dev).to(bf16)
    h = rms_norm_triton(x, nw, 1e-6, res)[0]
    for op, n, with_bias in (("qkv", qkv, qkv_bias), ("gate_up", 2 * inter, False)):
        w = (torch.randn(n, hidden, device=dev) * 0.02).to(bf16)
        b = (torch.randn(n, device=dev) * 0.02).to(bf16) if with_bias else None
        print(op_row(
            f"{shape} norm+{op}", m, timed(lambda w=w, b=b: F.linear(h, w, b)),
            {c: (lambda c=c, w=w, b=b: gemv_triton(h, w, b, c)) for c in CONFIGS},
            lambda c, w=w, b=b: gemv_triton(rms_norm_triton(x, nw, 1e-6, res)[0], w, b, c),
            {c: (lambda c=c, w=w, b=b: gemv_rmsnorm_triton(x, res, nw, 1e-6, w, b, c))
             for c in CONFIGS}), flush=True)
    down = (torch.randn(hidden, inter, device=dev) * 0.02).to(bf16)
    gu = torch.randn(m, 2 * inter, device=dev).to(bf16)
    act = silu_and_mul_triton(gu)
    print(op_row(
        f"{shape} silu+down", m, timed(lambda: F.linear(act, down)),
        {c: (lambda c=c: gemv_triton(act, down, None, c)) for c in CONFIGS},
        lambda c: gemv_triton(silu_and_mul_triton(gu), down, None, c),
        {c: (lambda c=c: gemv_silu_mul_triton(gu, down, None, c)) for c in CONFIGS}),
        flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4")
    p.add_argument("--shapes", default="qwen2-0.5b,llama3-8b")
    args = p.parse_args()
    print(f"{'op':22} {'m':>2} {'cuBLAS':>7} {'gemv':>7} {'chain':>8} {'fused':>7} "
          f"{'(config)':>14} {'tried':>7} {'(config)':>14} {'timing':>6}")
    for shape in args.shapes.split(","):
        for m in (int(r) for r in args.rows.split(",")):
            shape_rows(shape, m)


if __name__ == "__main__":
    main()
