"""How fast can one kernel read a decode projection's weight? A floor for the skinny matmul
(issue 16, batch-1 decode; docs/design.md, "Small-batch decode").

The batch-1 decode step's skinny matmuls expose 5-8 us per launch for weights of 1.6-17 MB,
40-65% of the bandwidth a long copy reaches. How much of that is the matmul's, and how much
any kernel of that size pays (launch, first bytes, ramp and tail of its grid)? Per weight
shape, each timed "cold" as `benchmarks/matmul_tune.py` times it (one call per weight copy,
enough copies to exceed twice the L2 cache, all in one CUDA graph, so every call reads its
weight from DRAM), one row of x, the engine's PDL launch where the kernel has it:

- `read`: a kernel that only reads the weight (each program sums a grid-stride run of
  BLOCK-element chunks and stores one float), over grids of 1-16 programs per SM, its first
  chunk loaded before the PDL wait as the skinny matmul loads its first columns: the floor.
- `gemv`: the engine's skinny matmul (`gemv_triton`) at every config `linear` times.
- `persist`: the one-row matmul (`gemv_triton`'s `_gemv_row_kernel`, opt-in in the engine:
  PAGEDRT_GEMV_ROW=1), whose programs (1-8 per SM) each walk every P-th block of BLOCK_N
  weight rows, whole K in registers (K <= 1,024 here), the next block's load issued before
  the current block's products: does a grid of long-lived programs read closer to the floor
  than one of many short ones? (Its first run, on 2026-12-07, timed this file's own copy of
  the kernel, which then moved into the engine.)
- `cublas`: `F.linear`.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/read_floor.py --out DIR
        [--shapes qwen2-0.5b,llama3-8b] [--quick]

Prints a table per shape (us per call and TB/s of weight bytes, best config of each kind);
everything in DIR/read_floor.json. Each kernel's output is checked against torch first.
Not a benchmark of record.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.matmul_tune import cold_us
from pagedrt.ops.gemv_triton import candidate_configs, gemv_triton
from pagedrt.ops.triton_utils import device_sms, pdl_enabled, pdl_launch, pdl_prologue

SHAPES = {  # (name, N, K): the projections' weights [N, K] and the LM head
    "qwen2-0.5b": [("qkv", 1152, 896), ("o", 896, 896), ("gate_up", 9728, 896),
                   ("down", 896, 4864), ("lm_head", 151936, 896)],
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                  ("down", 4096, 14336)],
}


@triton.jit
def _read_kernel(w_ptr, out_ptr, numel, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[pid] = the sum of chunks pid, pid + P, ... of BLOCK elements of w (fp32)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(w_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
    pdl_prologue(PDL)
    for start in range(pid * BLOCK + step, numel, step):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def read_launch(w: torch.Tensor, out: torch.Tensor, programs: int, block: int, warps: int,
                pdl: bool) -> None:
    _read_kernel[(programs,)](w, out, w.numel(), BLOCK=block, num_warps=warps,
                              **pdl_launch(pdl))


def read_configs(quick: bool) -> list[tuple[int, int, int]]:
    """(programs per SM, BLOCK, warps)."""
    per_sm = (2, 4, 8) if quick else (1, 2, 4, 8, 16)
    return [(p, b, w) for p in per_sm for b in (2048, 4096, 8192) for w in (4, 8)
            if b // (32 * w) <= 64]


def persist_configs(k: int, quick: bool) -> list[tuple[int, int, int, int]]:
    """One-row configs of the engine's `_gemv_row_kernel` (BLOCK_N, BLOCK_K, warps, programs
    per SM) whose two weight blocks fit in registers, K <= 1,024 (as first measured)."""
    if k > 1024:
        return []
    per_sm = (2, 4, 8) if quick else (1, 2, 4, 8)
    block_k = triton.next_power_of_2(k)
    return [(block_n, block_k, warps, p) for p in per_sm for block_n in (2, 4, 8, 16)
            for warps in (4, 8) if block_n * block_k // (32 * warps) <= 64]


def time_shape(n: int, k: int, dtype: torch.dtype, quick: bool) -> dict:
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    copies = max(2, min(64, math.ceil(2 * l2 / (n * k * 2)) + 1))
    weights = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
    x = torch.randn(1, k, device=dev, dtype=dtype)
    sms = device_sms(x)
    pdl = pdl_enabled(x)
    nbytes = n * k * weights[0].element_size()
    ref = F.linear(x.float(), weights[0].float())
    row = {"n": n, "k": k, "copies": copies, "bytes": nbytes, "pdl": pdl}

    def tbps(us: float) -> float:
        return nbytes / us / 1e6

    def entry(us: float) -> dict:
        return {"us": round(us, 3), "tb_s": round(tbps(us), 3)}

    row["cublas"] = entry(cold_us([functools.partial(F.linear, x, w) for w in weights]))
    row["read"] = {}
    for p, block, warps in read_configs(quick):
        out = torch.empty(p * sms, device=dev, dtype=torch.float32)
        read_launch(weights[0], out, p * sms, block, warps, pdl)
        torch.cuda.synchronize()
        total = weights[0].float().sum()
        if not torch.allclose(out.sum(), total, rtol=1e-3, atol=1e-2):
            raise AssertionError(f"read {p, block, warps}: {out.sum()} != {total}")
        row["read"][f"{p}/{block}/{warps}"] = entry(cold_us(
            [functools.partial(read_launch, w, out, p * sms, block, warps, pdl)
             for w in weights]))
    row["gemv"] = {}
    for cfg in candidate_configs(n, sms):
        y = gemv_triton(x, weights[0], config=cfg)
        torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
        row["gemv"][str(list(cfg))] = entry(cold_us(
            [functools.partial(gemv_triton, x, w, None, cfg) for w in weights]))
    row["persist"] = {}
    for cfg in persist_configs(k, quick):
        y = gemv_triton(x, weights[0], None, cfg)
        torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)
        row["persist"][f"{cfg[3]}/{cfg[0]}/{cfg[2]}"] = entry(cold_us(
            [functools.partial(gemv_triton, x, w, None, cfg) for w in weights]))
    del weights
    torch.cuda.empty_cache()
    return row


def best(table: dict) -> tuple[str, dict] | tuple[str, None]:
    if not table:
        return "-", None
    key = min(table, key=lambda c: table[c]["us"])
    return key, table[key]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="qwen2-0.5b,llama3-8b")
    ap.add_argument("--quick", action="store_true", help="fewer grid sizes")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("PAGEDRT_COMMIT"),
               "rows": {}}
    for model in args.shapes.split(","):
        for name, n, k in SHAPES[model]:
            row = time_shape(n, k, torch.bfloat16, args.quick)
            results["rows"][f"{model}:{name}"] = row
            cells = []
            for kind in ("read", "gemv", "persist"):
                cfg, e = best(row[kind])
                cells.append(f"{kind} {e['us']:7.2f} ({e['tb_s']:.2f}) {cfg:>14}" if e
                             else f"{kind} {'-':>7}")
            c = row["cublas"]
            print(f"{model:10} {name:8} {row['bytes'] / 1e6:7.1f} MB  cublas {c['us']:7.2f} "
                  f"({c['tb_s']:.2f})  " + "  ".join(cells), flush=True)
            with open(os.path.join(args.out, "read_floor.json"), "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
