"""Time the decode matmul (`pagedrt.ops.matmul_triton`) against cuBLAS at the decode GEMMs of
Qwen2-0.5B and Llama-3-8B over a grid of tile configs, each checked against F.linear first.
A tuning diagnostic for the H200 (issue 16), not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/matmul_tune.py --out DIR [--rows 8,32,64,128,256]
        [--models qwen2-0.5b,llama3-8b] [--ops qkv,o,gate_up,down]
        [--grid tiles|split|silu|narrow]
        [--shard I/N]

Two timings per op, both from CUDA graphs: "cold", the op called once on each of enough
copies of its weight that the copies exceed twice the L2 cache between two calls on one (as
in a decode step, where each layer's weights are read once per step and the other layers'
pass through L2 in between); and "hot", `triton.testing.do_bench_cudagraph` on one weight,
which is what `fastest_config` (the engine's choice at start-up) times.

`--shard I/N` only compiles every N-th config from the I-th (N shards run at once compile in
parallel; one unsharded run then finds every kernel in Triton's cache).

Prints per (model, op, rows) the cuBLAS time, the fastest config's, and the fastest of
`matmul_triton.CONFIGS` (the candidates the engine times); writes everything to
DIR/matmul_tune.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import os

import torch
import torch.nn.functional as F

from pagedrt.bench.presets import get_preset
from pagedrt.ops.matmul_triton import CONFIGS, matmul_triton


def grid(name: str = "tiles") -> list[tuple]:
    """"tiles": the 84 whole-K configs of the first tuning (and CONFIGS); "split": split-K
    over fewer tile shapes (split 1 included, as the reference); "silu": whole-K configs for
    gate/up with SwiGLU's activation (`--ops gate_up_silu`); "narrow": swapped tiles of 16 or
    32 weight rows (under wgmma's 64, so mma.sync: four or two times the programs of the
    64-row tiles at 8-64 rows, as the QKV + RoPE epilogue's 16- and 32-pair tiles), one to
    four warps, whole K and split-K 2 and 4, with CONFIGS as the reference. In every grid
    `--ops gate_up_silu` times only the whole-K configs (split-K has no SwiGLU epilogue)."""
    if name == "silu":  # whole K only (what silu_mul runs)
        swapped = [(bm, bn, bk, 4, st, True) for bm, bn, bk, st in
                   itertools.product((16, 32, 64), (64, 128), (64, 128), (3, 4, 5))]
        plain = [(bm, bn, 64, w, 3, False) for bm, bn, w in
                 itertools.product((64, 128), (64, 128), (4, 8))]
        return list(dict.fromkeys(swapped + plain))
    if name == "narrow":
        whole = [(bm, bn, bk, w, st, True) for bn, bm, bk, w, st in
                 itertools.product((16, 32), (16, 32), (64, 128, 256), (1, 2, 4), (3, 4))]
        split = [(bm, bn, 128, w, 4, True, sk) for bn, bm, w, sk in
                 itertools.product((16, 32), (16, 32), (1, 2, 4), (2, 4))]
        return list(dict.fromkeys(whole + split + CONFIGS))
    if name == "split":
        swapped = [(bm, bn, bk, 4, st, True, sk) for bm, bn, bk, st, sk in
                   itertools.product((16, 32, 64), (64, 128), (64, 128), (4,), (1, 2, 3, 4, 6, 8))]
        plain = [(bm, bn, 64, w, 3, False, sk) for bm, bn, w, sk in
                 itertools.product((64, 128), (64, 128), (4, 8), (1, 2, 4))]
        return list(dict.fromkeys(swapped + plain + CONFIGS))
    swapped = [(bm, bn, bk, 4, st, True) for bm, bn, bk, st in
               itertools.product((16, 32, 64), (64, 128), (64, 128), (3, 4, 5))]
    plain = [(bm, bn, bk, w, st, False) for bm, bn, bk, w, st in
             itertools.product((64, 128), (32, 64, 128), (64, 128), (4, 8), (3, 4))]
    return list(dict.fromkeys(swapped + plain + CONFIGS))


def ops(model: str) -> list[tuple[str, int, int, bool]]:
    """(name, N, K, bias) of a decoder layer's matmuls."""
    c = get_preset(model)
    hd = c.head_dim or c.hidden_size // c.num_attention_heads
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * hd
    bias = c.architecture.startswith("Qwen2")
    return [("qkv", qkv, c.hidden_size, bias),
            ("o", c.hidden_size, c.num_attention_heads * hd, False),
            ("gate_up", 2 * c.intermediate_size, c.hidden_size, False),
            ("gate_up_silu", 2 * c.intermediate_size, c.hidden_size, False),
            ("down", c.hidden_size, c.intermediate_size, False)]


def cold_us(fns: list, reps: int = 3) -> float:
    """Per-call time of `fns` (one per weight copy) called in turn, from one CUDA graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for f in fns:
                f()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / (5 * reps * len(fns))


def hot_us(fn) -> float:
    """`do_bench_cudagraph(fn)` in us, after this stream's work has finished: it runs fn on a
    stream of its own, and two split-K launches at once would share arrival counters."""
    from triton.testing import do_bench_cudagraph

    torch.cuda.synchronize()
    return 1e3 * do_bench_cudagraph(fn, rep=10)


def time_op(weights: list, bias, x: torch.Tensor, configs: list, silu: bool = False) -> dict:
    """cuBLAS and every config on x and `weights`, each config checked against cuBLAS
    first. silu: gate/up with SwiGLU's activation, against cuBLAS + the activation kernel."""
    from pagedrt.ops.fused_triton import silu_and_mul_triton

    def base(w):
        y = F.linear(x, w, bias)
        return silu_and_mul_triton(y) if silu else y

    def ours(w, cfg):
        return matmul_triton(x, w, bias, cfg, silu_mul=silu)

    ref = base(weights[0]).float()
    scale = max(ref.abs().max().item(), 1e-6)
    row = {"cublas_cold_us": cold_us([functools.partial(base, w) for w in weights]),
           "cublas_hot_us": hot_us(lambda: base(weights[0])), "configs": {}}
    for cfg in configs:
        try:
            err = (ours(weights[0], cfg).float() - ref).abs().max().item() / scale
        except Exception as e:  # noqa: BLE001 - a config this GPU cannot run
            row["configs"][str(cfg)] = {"error": type(e).__name__}
            continue
        if not err < 2e-2:
            row["configs"][str(cfg)] = {"error": f"mismatch {err:.3g}"}
            continue
        row["configs"][str(cfg)] = {
            "cold_us": cold_us([functools.partial(ours, w, cfg) for w in weights]),
            "hot_us": hot_us(functools.partial(ours, weights[0], cfg)),
            "rel_err": err}
    return row


def compile_only(weights: list, bias, x: torch.Tensor, configs: list, silu: bool) -> None:
    for cfg in configs:
        with contextlib.suppress(Exception):  # configs this GPU cannot run
            matmul_triton(x, weights[0], bias, cfg, silu_mul=silu)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="8,32,64,128,256")
    p.add_argument("--models", default="qwen2-0.5b,llama3-8b")
    p.add_argument("--shard", default="0/1")
    p.add_argument("--grid", default="tiles", choices=("tiles", "split", "silu", "narrow"))
    p.add_argument("--ops", default="qkv,o,gate_up,down",
                   help="of qkv, o, gate_up, gate_up_silu (with SwiGLU's activation), down")
    args = p.parse_args()
    shard, num_shards = (int(v) for v in args.shard.split("/"))
    rows_list = [int(v) for v in args.rows.split(",")]
    configs = grid(args.grid)
    dev, dt = torch.device("cuda"), torch.bfloat16
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    torch.manual_seed(0)
    results = []
    candidates = {str(c) for c in CONFIGS}
    for model in args.models.split(","):
        for name, n, k, has_bias in ops(model):
            if name not in args.ops.split(","):
                continue
            copies = max(2, min(64, math.ceil(2 * l2 / (n * k * 2)) + 1))
            weights = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
            bias = torch.randn(n, device=dev, dtype=dt) * 0.02 if has_bias else None
            for m in rows_list:
                x = torch.randn(m, k, device=dev, dtype=dt)
                if num_shards > 1:
                    compile_only(weights, bias, x, configs[shard::num_shards],
                                 name == "gate_up_silu")
                    continue
                silu = name == "gate_up_silu"
                op_configs = [c for c in configs if not silu or len(c) == 6 or c[6] == 1]
                row = {"model": model, "op": name, "n": n, "k": k, "rows": m,
                       "copies": copies, **time_op(weights, bias, x, op_configs, silu)}
                results.append(row)
                timed = {c: v for c, v in row["configs"].items() if "cold_us" in v}
                best = min(timed, key=lambda c, t=timed: t[c]["cold_us"])
                cand = [c for c in timed if c in candidates]
                best_c = min(cand, key=lambda c, t=timed: t[c]["cold_us"]) if cand else None
                print(f"{model:11s} {name:9s} N{n:6d} K{k:6d} M{m:4d}  cuBLAS "
                      f"{row['cublas_cold_us']:7.1f} us (hot {row['cublas_hot_us']:6.1f})  "
                      f"best {timed[best]['cold_us']:7.1f} {best}  (hot "
                      f"{timed[best]['hot_us']:6.1f})  CONFIGS' best "
                      + (f"{timed[best_c]['cold_us']:7.1f} {best_c}" if best_c else "-"),
                      flush=True)
            del weights
            torch.cuda.empty_cache()
    if num_shards == 1:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "matmul_tune.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
