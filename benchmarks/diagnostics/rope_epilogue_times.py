"""Device time of the 8-128-row QKV projection with RoPE and the K/V write in its epilogue
(pagedrt/ops/matmul_rope_triton.py), each candidate config, against the pair it replaces (the
tiled matmul with its usual config, or cuBLAS, then `rotary_write_kv_triton`) and each of that
pair's kernels alone; replayed from CUDA graphs (triton.testing.do_bench_cudagraph), hot L2 as
the engine's start-up timing sees it. A one-off diagnostic for issue 16.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/rope_epilogue_times.py [--rows 8,32,64,128]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from pagedrt.models.layers import RotaryEmbedding
from pagedrt.ops.fused_triton import rotary_write_kv_triton
from pagedrt.ops.matmul_rope_triton import CONFIGS, matmul_qkv_rope_triton
from pagedrt.ops.matmul_triton import matmul_triton

SHAPES = {"qwen2-0.5b": (896, 14, 2, 64, True), "llama3-8b": (4096, 32, 8, 128, False)}
PLAIN = (16, 64, 128, 4, 5, True)  # the QKV matmul's usual choice at these rows


def time_shape(name: str, hidden: int, heads: int, kv_heads: int, d: int, with_bias: bool,
               rows: list[int]) -> None:
    """One table line per row count: cuBLAS, the tiled matmul, the rotary kernel, the last
    two in a row, then each candidate of the fused kernel (us)."""
    dev, bf16 = "cuda", torch.bfloat16
    n = (heads + 2 * kv_heads) * d
    w = (torch.randn(n, hidden, device=dev) * 0.02).to(bf16)
    b = (torch.randn(n, device=dev) * 0.02).to(bf16) if with_bias else None
    cos_sin = RotaryEmbedding(d, 4096, 1e6).cos_sin_cache.to(dev)
    caches = torch.zeros(2, 64, 16, kv_heads, d, device=dev, dtype=bf16)

    def rotate(qkv, pos, slots):
        m = qkv.shape[0]
        q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        rotary_write_kv_triton(pos, q.view(m, heads, d), k.view(m, kv_heads, d),
                               v.view(m, kv_heads, d), cos_sin, caches[0], caches[1], slots)

    for m in rows:
        x = torch.randn(m, hidden, device=dev).to(bf16)
        pos = torch.randint(0, 4000, (m,), device=dev)
        slots = torch.randperm(64 * 16, device=dev)[:m]
        qkv = F.linear(x, w, b)
        fns = [lambda: F.linear(x, w, b), lambda: matmul_triton(x, w, b, PLAIN),  # noqa: B023
               lambda: rotate(qkv, pos, slots),  # noqa: B023
               lambda: rotate(matmul_triton(x, w, b, PLAIN), pos, slots)]  # noqa: B023
        fns += [lambda c=c: matmul_qkv_rope_triton(x, w, b, pos, cos_sin, caches[0],  # noqa: B023
                                                   caches[1], slots, heads, kv_heads, c)  # noqa: B023
                for c in CONFIGS]
        us = []
        for fn in fns:
            fn()
            torch.cuda.synchronize()
            us.append(1e3 * do_bench_cudagraph(fn, rep=20))
            torch.cuda.synchronize()
        print(f"{name:12} {m:4d} " + " ".join(f"{u:7.2f}" for u in us[:3])
              + f" {us[3]:9.2f} " + " ".join(f"{u:11.2f}" for u in us[4:]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="8,32,64,128")
    args = p.parse_args()
    print(f"{'shape':12} {'rows':>4} {'cuBLAS':>7} {'tiled':>7} {'rotary':>7} "
          f"{'tiled+rot':>9} " + " ".join(f"{'x'.join(map(str, c[:3])):>11}" for c in CONFIGS))
    for name, shape in SHAPES.items():
        time_shape(name, *shape, [int(r) for r in args.rows.split(",")])


if __name__ == "__main__":
    main()
