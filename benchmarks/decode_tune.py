"""Sweep the Triton decode-attention kernel's launch settings (tokens per tile, warps, pipeline
stages, split-K partitions) at the engine's decode shapes, with each setting checked against
the PyTorch reference first. A tuning diagnostic for the H200, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/decode_tune.py --out DIR [--quick]
        [--cases llama3-8b:64:4096,qwen2-0.5b:64:2048] [--kv-cache-dtype auto|fp8|both]
        [--small-grid | --default-only] [--block-n 64,128] [--warps 4,8] [--stages 2,3]
        [--splits 1,2] [--maxnreg 0,168] [--warp-tiles 0,1]
        [--reduce-heads 0,1,8] [--shard I/N] [--k-head-major]

`--block-n`, `--warps`, `--stages`, `--splits` and `--maxnreg` (a register cap per thread
passed to Triton's compiler, 0 for none) replace the full grid's axes; `--splits 0` is each
setting's split count as the launch would pick it (`decode_launch_plan`). `--warp-tiles 0,1`
adds the warp-tile kernel (`pagedrt.ops.attention_decode_warp_triton`: one 16-token slice of
each tile per warp; 1 the warp-tile kernel, 0 `_decode_kernel`) as an axis, and
`--reduce-heads 0,1,8` the query heads per split-K reduce program (0: the launch's,
`reduce_heads_per_program`; with `--default-only`, the default launch with each).
`--default-only` times only the default launch setting, e.g. over both caches:

    decode_tune.py --out DIR --default-only --kv-cache-dtype both \
        --cases qwen2-0.5b:1:512,qwen2-0.5b:64:4096,llama3-8b:64:4096

`--k-head-major` stores K head-major ([num_blocks, num_kv_heads, block_size, head_dim] storage
seen with the usual shape, so one head's tokens of a block are one contiguous run) and launches
without the argument checks, which accept only K in the usual layout: a layout experiment.

`--shard I/N` runs
every N-th setting from the I-th: N shards started at once compile in parallel (their
timings, taken on a shared GPU, are not to be read), after which one unsharded run finds
every kernel in Triton's cache and times them alone.

With `--kv-cache-dtype fp8` the cache is the bf16 one quantized per token and KV head
(`pagedrt.ops.fp8`), and bandwidth counts the FP8 bytes plus their scales.

Prints, per shape, the current default's time and the fastest settings; writes every timing to
DIR/decode_tune.json. Block ids are a random permutation, as in a cache that has been in use.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os

import torch
import triton

from pagedrt.bench.attention import fp8_cache
from pagedrt.bench.common import int_list
from pagedrt.kv.kv_cache import fp8_v_dim_major_requested
from pagedrt.ops.attention_reference import paged_attention_decode_reference
from pagedrt.ops.attention_triton import (
    decode_launch_plan,
    paged_attention_decode_triton,
)
from pagedrt.ops.fp8 import dequantize_fp8
from pagedrt.ops.triton_utils import device_sms, to_v_dim_major

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, no timing
# (name, num_heads, num_kv_heads, head_dim)
MODELS = {"qwen2-0.5b": (14, 2, 64), "llama3-8b": (32, 8, 128), "smollm2": (9, 3, 64)}


def make_case(num_seqs, ctx, num_heads, num_kv_heads, head_dim, block_size=16, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    blocks_per_seq = triton.cdiv(ctx, block_size)
    num_blocks = num_seqs * blocks_per_seq + 1
    dt = torch.bfloat16
    q = torch.randn(num_seqs, num_heads, head_dim, device=DEVICE, dtype=dt, generator=g)
    k = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device=DEVICE, dtype=dt,
                    generator=g)
    v = torch.randn_like(k)
    perm = torch.randperm(num_blocks, device=DEVICE, generator=g)[: num_seqs * blocks_per_seq]
    tables = perm.view(num_seqs, blocks_per_seq).to(torch.int32)
    lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=DEVICE)
    return q, k, v, tables, lens


def timing_at(timings: list[dict], setting: dict) -> dict | None:
    """The first of `timings` taken at `setting` (its keys, maxnreg and warp_tiles; absent =
    0)."""
    return next((t for t in timings if all(
        t.get(key, 0) == setting.get(key, 0)
        for key in (*setting, "maxnreg", "warp_tiles", "reduce_heads"))),
                None)


def plan_splits(shape: tuple, block_n: int, warps: int, stages: int, maxnreg: int,
                warp_tiles: int) -> int:
    """--splits 0: the split count the launch picks for this setting; shape = (num_seqs,
    num_kv_heads, head_dim, fp8, context, num_sms)."""
    config = {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "maxnreg": maxnreg,
              "warp_tiles": warp_tiles}
    try:
        return decode_launch_plan(*shape, config=config)[2]
    except ValueError:  # (the launch raises it again and is recorded as failed)
        return 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cases", default=None,
                   help="MODEL:NUM_SEQS:CTX,... (models: " + ", ".join(MODELS) + ")")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "both"])
    p.add_argument("--small-grid", action="store_true",
                   help="BLOCK_N 32/64/128 x warps 4/8 x stages 2/3, default splits only")
    p.add_argument("--default-only", action="store_true",
                   help="only the default launch setting")
    for axis, default in (("block-n", "32,64,128"), ("warps", "2,4,8"), ("stages", "2,3,4"),
                          ("splits", "1,2,4,8"), ("maxnreg", "0"), ("warp-tiles", "0"),
                          ("reduce-heads", "0")):
        # (0 allowed: --maxnreg 0 is no cap, --warp-tiles 0 `_decode_kernel`)
        ints = functools.partial(int_list, minimum=0)
        p.add_argument(f"--{axis}", type=ints, default=ints(default),
                       help=f"grid axis (default {default})")
    p.add_argument("--shard", default="0/1", help="I/N: every N-th setting from the I-th")
    p.add_argument("--k-head-major", action="store_true",
                   help="K stored [num_blocks, num_kv_heads, block_size, head_dim] (module doc)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cases = [("qwen2-0.5b", 256, 520), ("qwen2-0.5b", 256, 640), ("qwen2-0.5b", 256, 1024),
             ("qwen2-0.5b", 64, 640), ("qwen2-0.5b", 8, 4096), ("llama3-8b", 256, 640),
             ("smollm2", 256, 640)]
    if args.cases:
        cases = [(m, int(b), int(c)) for m, b, c in (x.split(":") for x in args.cases.split(","))]
    if args.quick:
        cases = cases[:2]
    grid = list(itertools.product(args.block_n, args.warps, args.stages, args.splits,
                                  args.maxnreg, args.warp_tiles, args.reduce_heads))
    shard, num_shards = (int(x) for x in args.shard.split("/"))
    dtypes = ["auto", "fp8"] if args.kv_cache_dtype == "both" else [args.kv_cache_dtype]
    results, table = [], []
    for (model, num_seqs, ctx), kv_dtype in itertools.product(cases, dtypes):
        h, kvh, d = MODELS[model]
        q, k, v, bt, sl = make_case(num_seqs, ctx, h, kvh, d)
        scales = {}
        if kv_dtype == "fp8":  # the cache the engine would hold, and its own reference
            (k, ks), (v, vs) = fp8_cache(k), fp8_cache(v)
            scales = {"k_scales": ks, "v_scales": vs}
            kf = dequantize_fp8(k, scales["k_scales"].transpose(1, 2))
            vf = dequantize_fp8(v, scales["v_scales"].transpose(1, 2))
            if fp8_v_dim_major_requested():  # V as the engine would store it
                v = to_v_dim_major(v)
        else:
            kf, vf = k.float(), v.float()
        if args.k_head_major:  # same values, a head's tokens of a block contiguous
            k = k.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        ref = paged_attention_decode_reference(q.float(), kf, vf, bt, sl, d ** -0.5)
        per_token = 2 * kvh * (d * k.element_size() + (4 if scales else 0))
        kv_bytes = num_seqs * ctx * per_token
        sms = device_sms(q)
        # the default launch's setting (decode_launch_plan)
        cfg, wt, sp = decode_launch_plan(num_seqs, kvh, d, kv_dtype == "fp8", ctx, sms)
        default = {"BLOCK_N": cfg["BLOCK_N"], "num_warps": cfg["num_warps"],
                   "num_stages": cfg["num_stages"], "maxnreg": cfg.get("maxnreg", 0),
                   "warp_tiles": wt, "splits": sp}
        timings = []
        default_points = [(*(default[key] for key in (
            "BLOCK_N", "num_warps", "num_stages", "splits", "maxnreg", "warp_tiles")), rh)
            for rh in args.reduce_heads]
        run_grid = grid
        if args.small_grid:
            run_grid = list(itertools.product([32, 64, 128], [4, 8], [2, 3], [0], [0], [0],
                                              [0]))
        if args.default_only:
            run_grid = []

        shape = (num_seqs, kvh, d, kv_dtype == "fp8", ctx, sms)
        run_grid = list(dict.fromkeys(
            (bn, w, st, sp or plan_splits(shape, bn, w, st, r, wt), r, wt, rh)
            for bn, w, st, sp, r, wt, rh in run_grid))
        run_grid = run_grid + [x for x in default_points if x not in run_grid]
        for bn, warps, stages, splits, maxnreg, wt, rh in run_grid[shard::num_shards]:
            if model == "llama3-8b" and bn == 128 and kv_dtype != "fp8":
                continue
            cfg = {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "maxnreg": maxnreg,
                   "warp_tiles": wt, **({"reduce_heads": rh} if rh else {})}
            setting = {**cfg, "splits": splits}
            try:
                out = paged_attention_decode_triton(
                    q, k, v, bt, sl, d ** -0.5, splits, config=cfg,
                    validate=not args.k_head_major, **scales)
                err = (out.float() - ref).abs().max().item()
                if err > 2e-2:
                    timings.append({**setting, "error": err, "ms": None})
                    continue
                ms = triton.testing.do_bench_cudagraph(functools.partial(
                    paged_attention_decode_triton, q, k, v, bt, sl, d ** -0.5, splits,
                    config=cfg, validate=not args.k_head_major, **scales), rep=30)
            except Exception as e:  # noqa: BLE001 - a config that does not fit: record it
                timings.append({**setting, "failed": str(e)[:200]})
                continue
            timings.append({**setting, "ms": ms, "error": err, "tb_s": kv_bytes / ms / 1e9})
        ok = [t for t in timings if t.get("ms")]
        ok.sort(key=lambda t: t["ms"])
        d_t = timing_at(ok, default)
        results.append({"model": model, "num_seqs": num_seqs, "ctx": ctx, "kv_bytes": kv_bytes,
                        "kv_cache_dtype": kv_dtype,
                        "default": default, "default_ms": d_t and d_t["ms"], "timings": ok,
                        "bad": [t for t in timings if not t.get("ms")]})
        if not ok:
            table.append(f"{model:11s} {kv_dtype:4s} B{num_seqs:<4d} ctx{ctx:<5d} no setting ran: "
                         f"{results[-1]['bad'][:2]}")
            print(table[-1], flush=True)
            continue
        best = ok[0]
        dflt = f"{d_t['ms'] * 1e3:7.1f} us ({d_t['tb_s']:.2f} TB/s)" if d_t else "not run"
        table.append(f"{model:11s} {kv_dtype:4s} B{num_seqs:<4d} ctx{ctx:<5d} default {dflt}"
                     f" | best {best['ms']*1e3:7.1f} us "
                     f"({best['tb_s']:.2f} TB/s) BN{best['BLOCK_N']} w{best['num_warps']} "
                     f"s{best['num_stages']} sp{best['splits']} r{best.get('maxnreg', 0)} "
                     f"wt{best['warp_tiles']} "
                     f"rh{best.get('reduce_heads', 0)} | next: " + ", ".join(
                         f"BN{t['BLOCK_N']}w{t['num_warps']}s{t['num_stages']}sp{t['splits']}"
                         f"r{t.get('maxnreg', 0)}wt{t['warp_tiles']}"
                         f"rh{t.get('reduce_heads', 0)}"
                         f"={t['ms']*1e3:.1f}"
                         for t in ok[1:6]))
        print(table[-1], flush=True)
    with open(os.path.join(args.out, "decode_tune.json"), "w") as f:
        gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
        json.dump({"gpu": gpu, "results": results}, f, indent=1)
    print("\n".join(table))


if __name__ == "__main__":
    main()
