"""Attention of a verification step on the GPU: q = k + 1 query tokens per sequence over its
paged context, as the extend kernel (one program per KV head and sequence) against per-token
decode rows (the decode kernel over b * q rows, split over the context), as the verification
CUDA graphs run it (pagedrt/engine/cuda_graphs.py). Kernel time per layer, replayed from a CUDA
graph (`pagedrt.bench.attention.bench_ms`). A one-off diagnostic.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/verify_attention.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import torch

from pagedrt.bench.attention import bench_ms
from pagedrt.ops import attention_triton as tri

HEADS = {"smollm2 9/3x64": (9, 3, 64), "qwen2-0.5b 14/2x64": (14, 2, 64),
         "llama3-8b 32/8x128": (32, 8, 128)}


def case(name: str, batch: int, q: int, context: int, block_size: int = 16) -> dict:
    num_heads, num_kv_heads, head_dim = HEADS[name]
    seq_len = context + q
    blocks = -(-seq_len // block_size)
    num_blocks = batch * blocks + 1
    dtype = torch.bfloat16
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype,
                          device="cuda")
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks - 1, device="cuda")[: batch * blocks].view(
        batch, blocks).to(torch.int32)
    query = torch.randn(batch * q, num_heads, head_dim, dtype=dtype, device="cuda")
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * q
    positions = (torch.arange(context, seq_len, device="cuda")[None, :]
                 .expand(batch, q).reshape(-1))
    scale = head_dim ** -0.5

    def extend():
        return tri.paged_attention_extend_triton(query, k_cache, v_cache, tables, cu, seq_lens,
                                                 scale, max_query_len=q, validate=False)

    def rows():
        return tri.paged_attention_decode_triton(
            query, k_cache, v_cache, tables.repeat_interleave(q, dim=0),
            (positions + 1).to(torch.int32), scale, validate=False)

    err = (extend().float() - rows().float()).abs().max().item()
    ext_ms, rows_ms = bench_ms(extend), bench_ms(rows)
    return {"heads": name, "batch": batch, "q": q, "context": context, "extend_us": 1e3 * ext_ms,
            "rows_us": 1e3 * rows_ms, "speedup": ext_ms / rows_ms, "max_abs_diff": err}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="")
    args = p.parse_args()
    results = []
    print(f"{'heads':<20} {'b':>3} {'q':>3} {'ctx':>6} {'extend us':>10} {'rows us':>8} "
          f"{'x':>6} {'diff':>8}")
    for name in HEADS:
        for batch in (1, 2, 4):
            for q in (6, 11):
                for context in (512, 2048):
                    r = case(name, batch, q, context)
                    results.append(r)
                    print(f"{name:<20} {batch:>3} {q:>3} {context:>6} {r['extend_us']:>10.1f} "
                          f"{r['rows_us']:>8.1f} {r['speedup']:>5.2f}x "
                          f"{r['max_abs_diff']:>8.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
