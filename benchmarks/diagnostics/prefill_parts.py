"""Two parts of a Qwen2-0.5B prefill step measured alone on a GPU, to see what a faster
prefill could come from. A tuning diagnostic, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/prefill_parts.py --out DIR [--shard I/N]

Why: the 256 x 512/128 workload spends about half its time in 16,384-token prefill steps
(H100, 2026-12-05: 9 steps, 0.224 of 0.49 s). torch.profiler over one such step on the H200
(benchmarks/results/engine/runs/profile_step_79929c7/profile_prefill.txt, 22.7 ms on the
device) gave the cuBLAS GEMMs 15.6 ms at 650-770 TFLOP/s, but the SiLU-and-mul 2.78 ms (its
478 MB per layer at 4.1 TB/s: the gate/up output leaves L2 and comes back), the extend kernel
2.20 ms (about 165 TFLOP/s of causal attention) and the RMSNorms 1.38 ms.

Part A, the extend kernel (`paged_attention_extend_triton`) at the engine's prefill shape:
32 prompts x 512 tokens packed (cu_seqlens_q), 14 / 2 heads x 64, bf16, block size 16,
shuffled blocks, every key read from the cache (the bf16 prefill's path), over a grid of
launch configs (BLOCK_M query rows per program, BLOCK_N keys per tile, warps, stages). Each
config is checked against a dense causal reference (SDPA in fp32 per prompt) before it is
timed; TFLOP/s counts the causal pairs (4 x pairs x head_dim x heads). The same at Llama-3-8B
heads (4 prompts x 4,096, 32 / 8 x 128) for the config the engine uses there.

Part C, gate/up with SwiGLU's activation in the matmul's epilogue (`matmul_triton`'s
silu_mul, the decode path's kernel) at 16,384 and 4,096 rows over a grid of tiles, against
cuBLAS then the activation kernel (what prefill runs): the [rows, 9,728] product is never
written. Part A also at 16 x 1,024 and 4 x 4,096 tokens.

Part B, the MLP of 16,384 rows (gate/up 896 -> 2 x 4,864, the model's SiluAndMul, down 4,864 ->
896; random bf16 weights): whole, as the engine runs it, and in row chunks of 1,024 to 8,192,
so that a chunk's gate/up output (40 MB at 2,048 rows) may still be in L2 when the
activation and the down projection read it. Each chunked result is checked against the whole
one first (cuBLAS may pick another kernel for fewer rows, so within bf16 rounding).

Times are medians of `triton.testing.do_bench` over CUDA-graph replays (`bench_ms`). With
`--shard I/N` only every N-th extend config runs and nothing is written: N shards started at
once compile in parallel, then an unsharded run finds the kernels in Triton's cache.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import torch.nn.functional as F

from pagedrt.bench.attention import BLOCK_SIZE, bench_ms
from pagedrt.models.layers import SiluAndMul
from pagedrt.ops import attention_extend_triton as ext

DTYPE = torch.bfloat16
SHAPES = {  # name: prompts, tokens per prompt, heads, KV heads, head_dim
    "qwen2-0.5b": (32, 512, 14, 2, 64),
    "qwen2-0.5b 16 x 1024": (16, 1024, 14, 2, 64),
    "qwen2-0.5b 4 x 4096": (4, 4096, 14, 2, 64),
    "llama3-8b": (4, 4096, 32, 8, 128),
}
GRID = list(itertools.product((64, 128, 256), (32, 64, 128), (4, 8), (2, 3, 4)))
# gate/up with SwiGLU's activation in its epilogue (matmul_triton's silu_mul) at prefill's row
# counts: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, swap_ab)
SILU_GRID = [(m, n, k, w, s, False) for m, n, k, w, s in itertools.product(
    (64, 128), (64, 128), (32, 64, 128), (4, 8), (3, 4))]


def extend_inputs(num_prompts, length, num_heads, num_kv_heads, head_dim, seed=0):
    """Packed prompts of `length` tokens each with their own shuffled blocks, their K/V in
    the cache: (query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per_seq = -(-length // BLOCK_SIZE)
    num_blocks = num_prompts * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=g)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=g)
    tables = torch.randperm(num_blocks, device="cuda", generator=g).view(
        num_prompts, blocks_per_seq).int()
    query = torch.randn(num_prompts * length, num_heads, head_dim, device="cuda", dtype=DTYPE,
                        generator=g)
    cu = torch.arange(0, num_prompts + 1, device="cuda", dtype=torch.int32) * length
    seq_lens = torch.full((num_prompts,), length, device="cuda", dtype=torch.int32)
    return query, k_cache, v_cache, tables, cu, seq_lens


def extend_reference(query, k_cache, v_cache, tables, length, scale):
    """Dense causal attention per prompt in fp32: [num_tokens, num_heads, head_dim]."""
    outs = []
    for s in range(tables.shape[0]):
        blocks = tables[s].long()
        k = k_cache[blocks].flatten(0, 1)[:length].float().transpose(0, 1)  # [kv, T, d]
        v = v_cache[blocks].flatten(0, 1)[:length].float().transpose(0, 1)
        q = query[s * length:(s + 1) * length].float().transpose(0, 1)  # [heads, T, d]
        group = q.shape[0] // k.shape[0]
        o = F.scaled_dot_product_attention(
            q, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0), is_causal=True,
            scale=scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def extend_part(name: str, configs, timed: bool) -> dict:
    num_prompts, length, heads, kv_heads, head_dim = SHAPES[name]
    query, k_cache, v_cache, tables, cu, seq_lens = extend_inputs(num_prompts, length, heads,
                                                                  kv_heads, head_dim)
    scale = head_dim ** -0.5
    ref = extend_reference(query, k_cache, v_cache, tables, length, scale)
    flops = 4 * num_prompts * (length * (length + 1) / 2) * head_dim * heads
    default = ext._extend_launch_configs(head_dim, DTYPE, on_gpu=True)[0]
    rows = {}
    for cfg in [None] + configs:
        key = "default" if cfg is None else "{BLOCK_M}/{BLOCK_N}/{num_warps}/{num_stages}".format(
            **cfg)

        def fn(cfg=cfg):
            return ext.paged_attention_extend_triton(query, k_cache, v_cache, tables, cu,
                                                     seq_lens, scale, max_query_len=length,
                                                     config=cfg)
        try:
            err = (fn().float() - ref).abs().max().item()
        except Exception as e:  # noqa: BLE001 (out of shared memory, registers: recorded)
            rows[key] = {"error": repr(e)[:120]}
            continue
        if err > 3e-2:
            rows[key] = {"error": f"max abs error {err:.3g} against the fp32 reference"}
            continue
        rows[key] = {"max_abs_err": err}
        if timed:
            ms = bench_ms(fn)
            rows[key].update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
    sdpa = None
    if timed:  # the dense peer: flash attention on contiguous K/V of one long batch
        q = query.view(num_prompts, length, heads, head_dim).transpose(1, 2)
        k = torch.randn(num_prompts, kv_heads, length, head_dim, device="cuda", dtype=DTYPE)
        v = torch.randn_like(k)
        try:
            sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   enable_gqa=True))
        except RuntimeError:
            sdpa = None
    return {"shape": SHAPES[name], "default_config": default, "flops": flops, "configs": rows,
            "sdpa_ms": sdpa}


def mlp_part(rows: int = 16384, hidden: int = 896, inter: int = 4864, seed: int = 0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", dtype=DTYPE, generator=g)
    w_gate_up = torch.randn(2 * inter, hidden, device="cuda", dtype=DTYPE, generator=g) * 0.03
    w_down = torch.randn(hidden, inter, device="cuda", dtype=DTYPE, generator=g) * 0.03
    act = SiluAndMul()
    out = torch.empty(rows, hidden, device="cuda", dtype=DTYPE)

    def whole():
        return F.linear(act(F.linear(x, w_gate_up)), w_down)

    def chunked(size):
        def fn():
            for start in range(0, rows, size):
                torch.mm(act(F.linear(x[start:start + size], w_gate_up)), w_down.t(),
                         out=out[start:start + size])
            return out
        return fn

    ref = whole().float()
    flops = 2 * rows * hidden * 3 * inter
    res = {"rows": rows, "flops": flops, "variants": {}}
    ms = bench_ms(whole)
    res["variants"]["whole"] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
    ms = bench_ms(lambda: F.linear(x, w_gate_up))
    res["gate_up_alone_ms"] = ms
    h = F.linear(x, w_gate_up)
    res["silu_mul_alone_ms"] = bench_ms(lambda: act(h))
    a = act(h)
    res["down_alone_ms"] = bench_ms(lambda: F.linear(a, w_down))
    for size in (1024, 2048, 4096, 8192):
        fn = chunked(size)
        err = (fn().float() - ref).abs().max().item() / ref.abs().max().item()
        ms = bench_ms(fn)
        res["variants"][f"chunks of {size}"] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12,
                                                "max_rel_err": err}
    return res


def silu_part(configs, timed: bool, hidden: int = 896, inter: int = 4864,
              seed: int = 0) -> dict:
    """gate/up + SiLU-and-mul as the engine runs them past 128 rows (F.linear, then the
    activation kernel) against `matmul_triton(..., silu_mul=True)` per config, at 16,384 and
    4,096 rows; each config checked against the plain path first (max abs difference over
    the output's max, bf16 rounding of the two paths' sums)."""
    from pagedrt.ops.matmul_triton import matmul_triton

    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(2 * inter, hidden, device="cuda", dtype=DTYPE, generator=g) * 0.03
    act = SiluAndMul()
    res = {}
    for rows in (16384, 4096):
        x = torch.randn(rows, hidden, device="cuda", dtype=DTYPE, generator=g)
        ref = act(F.linear(x, w)).float()
        flops = 2 * rows * hidden * 2 * inter
        part = {"flops": flops, "configs": {}}
        if timed:
            part["plain_ms"] = bench_ms(lambda x=x: act(F.linear(x, w)))
        for cfg in configs:
            key = "/".join(str(int(v)) for v in cfg[:5])
            try:
                y = matmul_triton(x, w, None, cfg, silu_mul=True)
                err = (y.float() - ref).abs().max().item() / ref.abs().max().item()
            except Exception as e:  # noqa: BLE001 (out of shared memory: recorded)
                part["configs"][key] = {"error": repr(e)[:120]}
                continue
            if err > 2e-2:
                part["configs"][key] = {"error": f"max rel error {err:.3g}"}
                continue
            part["configs"][key] = {"max_rel_err": err}
            if timed:
                ms = bench_ms(lambda cfg=cfg, x=x: matmul_triton(x, w, None, cfg,
                                                                silu_mul=True))
                part["configs"][key].update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
        res[rows] = part
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shard", default="0/1", help="I/N: every N-th extend config from the I-th")
    args = p.parse_args()
    shard, num_shards = (int(v) for v in args.shard.split("/"))
    timed = num_shards == 1
    configs = [{"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s}
               for m, n, w, s in GRID][shard::num_shards]
    silu_configs = SILU_GRID[shard::num_shards]
    res = {"commit": os.environ.get("PAGEDRT_COMMIT", "head"),
           "gpu": torch.cuda.get_device_name(), "extend": {}}
    for name in SHAPES:
        res["extend"][name] = extend_part(name, configs if "qwen2" in name else [], timed)
    res["silu"] = silu_part(silu_configs, timed)
    if not timed:
        return
    res["mlp"] = mlp_part()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prefill_parts.json"), "w") as f:
        json.dump(res, f, indent=1)
    for name, part in res["extend"].items():
        rows = part["configs"]
        ok = {k: v for k, v in rows.items() if "ms" in v}
        best = sorted(ok, key=lambda k: ok[k]["ms"])[:5]
        print(f"extend {name} {part['shape']}: default {part['default_config']}"
              f" {rows['default'].get('ms', float('nan')):.3f} ms"
              f" ({rows['default'].get('tflops', 0):.0f} TFLOP/s); SDPA flash dense"
              f" {part['sdpa_ms'] or float('nan'):.3f} ms; failed {len(rows) - len(ok)}")
        for k in best:
            print(f"  {k:>14} {ok[k]['ms']:.3f} ms {ok[k]['tflops']:.0f} TFLOP/s")
    for rows, part in res["silu"].items():
        ok = {k: v for k, v in part["configs"].items() if "ms" in v}
        print(f"gate/up + SiLU {rows} rows: cuBLAS + activation kernel {part['plain_ms']:.3f} ms"
              f" ({part['flops'] / (part['plain_ms'] * 1e-3) / 1e12:.0f} TFLOP/s); failed"
              f" {len(part['configs']) - len(ok)}")
        for k in sorted(ok, key=lambda k: ok[k]["ms"])[:4]:
            print(f"  {k:>16} {ok[k]['ms']:.3f} ms {ok[k]['tflops']:.0f} TFLOP/s")
    mlp = res["mlp"]
    print(f"mlp {mlp['rows']} rows: gate/up {mlp['gate_up_alone_ms']:.3f} ms, SiLU-and-mul"
          f" {mlp['silu_mul_alone_ms']:.3f}, down {mlp['down_alone_ms']:.3f}")
    for k, v in mlp["variants"].items():
        print(f"  {k:>16} {v['ms']:.3f} ms {v['tflops']:.0f} TFLOP/s"
              + (f" (max rel err {v['max_rel_err']:.2g})" if "max_rel_err" in v else ""))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
