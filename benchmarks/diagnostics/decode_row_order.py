"""Decode attention over rows of unequal contexts: does the order in which the programs take
the rows matter? A diagnostic for issue 16's nano-vllm workload, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/decode_row_order.py --out DIR
        [--heads qwen2-0.5b] [--rows 256,192,128,64] [--ranges 100:1100,100:2048]
        [--table-tokens 4096] [--layers 8] [--kv-cache-dtype auto|fp8] [--nanovllm-steps 64]

The GPU starts a kernel's programs in launch order and a new one whenever one ends. Unsplit
(256 rows of Qwen2-0.5B's 2 KV heads: 512 programs, a few per SM), a row whose context is
long and whose programs start last could run alone at the end; with lengths uniform in
100..2,048 a list-scheduling model puts that tail at about 1.5x the balanced time, and
longest-first order (LPT) near 1.03x. Each case times `paged_attention_decode_triton` (the
default launch, the split count from the block table's width as in the engine's graphs) over
`--layers` caches in one CUDA graph, the rows:

  as given       in a random order (the engine's batch order has nothing to do with length)
  longest first  q, block tables and lengths permuted by context, descending, so that the
                 programs of the longest rows start first
  shortest first the reverse
  uniform        every row at the mean context: the same bytes with no imbalance

and, with `--nanovllm-steps N`, every N-th decode step of nano-vllm's workload (256 requests,
input and output lengths uniform in 100..1,024 as `pagedrt bench throughput --workload
nanovllm` draws them; a step t holds the requests still generating, at context input + t + 1),
as given against longest first, summed with weight N. Every variant's output is checked
against the given order's, which must be equal bit for bit (the same programs, started in
another order), and the given order's against the torch reference on one layer.

Prints a table; writes DIR/decode_row_order.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random

import torch
import triton

from pagedrt.bench.attention import fp8_cache
from pagedrt.ops.attention_reference import paged_attention_decode_reference
from pagedrt.ops.attention_triton import decode_launch_plan, paged_attention_decode_triton
from pagedrt.ops.triton_utils import device_sms, to_v_dim_major

MODELS = {"qwen2-0.5b": (14, 2, 64), "llama3-8b": (32, 8, 128), "smollm2": (9, 3, 64)}
BLOCK_SIZE = 16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, no timing


def make_layers(num_layers, num_seqs, table_tokens, heads, fp8, seed):
    """`num_layers` caches, each with a full block table of table_tokens per row (random block
    ids, as in a cache in use); returns (query, [KVCacheLayer-like tuples], block_tables)."""
    num_heads, num_kv_heads, head_dim = heads
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    width = triton.cdiv(table_tokens, BLOCK_SIZE)
    num_blocks = num_seqs * width + 1
    q = torch.randn(num_seqs, num_heads, head_dim, device=DEVICE, dtype=torch.bfloat16,
                    generator=g)
    layers = []
    for _ in range(num_layers):
        k = torch.randn(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, device=DEVICE,
                        dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        if fp8:  # the cache the engine would hold, V dim-major
            (k8, ks), (v8, vs) = fp8_cache(k), fp8_cache(v)
            layers.append((k8, to_v_dim_major(v8), ks, vs))
        else:
            layers.append((k, v, None, None))
    perm = torch.randperm(num_blocks, device=DEVICE, generator=g)[: num_seqs * width]
    tables = perm.view(num_seqs, width).to(torch.int32)
    return q, layers, tables


def run_layers(q, layers, tables, lens, num_splits=None):
    outs = []
    for k, v, ks, vs in layers:
        outs.append(paged_attention_decode_triton(
            q, k, v, tables, lens, q.shape[-1] ** -0.5, num_splits=num_splits,
            k_scales=ks, v_scales=vs, validate=False))
    return outs


def time_us(fn, layers) -> float:
    """us per layer's call, from replays of one CUDA graph of all the layers (nan on the
    CPU, where the script only checks)."""
    if DEVICE == "cpu":
        return float("nan")
    return triton.testing.do_bench_cudagraph(fn, rep=200) * 1000 / layers


def kv_bytes(lens, heads, fp8) -> int:
    _, num_kv_heads, head_dim = heads
    per_token = 2 * num_kv_heads * (head_dim + 4 if fp8 else head_dim * 2)
    return int(lens.sum().item()) * per_token


def longest_first(lens: torch.Tensor) -> torch.Tensor:
    return torch.argsort(lens, descending=True, stable=True)


def time_case(q, layers, tables, lens, heads, fp8, variants):
    """{variant: (us per layer, TB/s)}. A variant is (lens, order, splits): the rows taken
    in `order` (q, tables and lens permuted, so grid row i runs row order[i]; None: as
    given), each such output checked against the given order's rows."""
    base = run_layers(q, layers, tables, lens)
    out = {}
    for name, (lens_v, order, splits) in variants.items():
        if order is not None:
            q_v, tables_v, lens_v = q[order], tables[order], lens_v[order]
        else:
            q_v, tables_v = q, tables
        got = run_layers(q_v, layers, tables_v, lens_v, splits)
        if order is not None and splits is None:
            for a, b in zip(got, base):
                if not torch.equal(a, b[order]):
                    raise AssertionError(f"{name}: output differs from the given order's")
        us = time_us(lambda q_v=q_v, tables_v=tables_v, lens_v=lens_v, splits=splits:
                     run_layers(q_v, layers, tables_v, lens_v, splits), len(layers))
        out[name] = (us, kv_bytes(lens_v, heads, fp8) / us / 1e6)
    return out


def check_reference(q, layer, tables, lens):
    k, v, ks, vs = layer
    got = paged_attention_decode_triton(q, k, v, tables, lens, q.shape[-1] ** -0.5,
                                        k_scales=ks, v_scales=vs)
    want = paged_attention_decode_reference(q.float(), k if ks is not None else k.float(),
                                            v if ks is not None else v.float(), tables, lens,
                                            q.shape[-1] ** -0.5, k_scales=ks, v_scales=vs)
    err = (got.float() - want.float()).abs().max().item()
    if err > 2e-2:
        raise AssertionError(f"decode launch against the reference: max error {err}")
    return err


def nanovllm_lengths(seed: int = 0):
    """(input, output) lengths of nano-vllm's workload as `pagedrt bench throughput` draws
    them (the prompt's tokens drawn in between, so the same random stream)."""
    random.seed(seed)
    ins, outs = [], []
    for _ in range(256):
        n = random.randint(100, 1024)
        for _ in range(n):
            random.randint(0, 10000)
        ins.append(n)
    for _ in range(256):
        outs.append(random.randint(100, 1024))
    return ins, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", default="qwen2-0.5b", choices=sorted(MODELS))
    ap.add_argument("--rows", default="256,192,128,64")
    ap.add_argument("--ranges", default="100:1100,100:2048")
    ap.add_argument("--table-tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument("--nanovllm-steps", type=int, default=64,
                    help="time every N-th decode step of nano-vllm's workload (0: none)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    heads = MODELS[args.heads]
    fp8 = args.kv_cache_dtype == "fp8"
    sms = device_sms(torch.empty(0, device=DEVICE)) if DEVICE == "cuda" else 132
    results = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "heads": args.heads, "fp8": fp8,
               "table_tokens": args.table_tokens, "cases": [], "nanovllm": []}
    max_rows = max(int(r) for r in args.rows.split(","))
    q_all, layers, tables_all = make_layers(args.layers, max(max_rows, 256), args.table_tokens,
                                            heads, fp8, 0)
    rows_out = []
    for rows in (int(r) for r in args.rows.split(",")):
        for rng in args.ranges.split(","):
            lo, hi = (int(x) for x in rng.split(":"))
            g = torch.Generator().manual_seed(rows * 7919 + hi)
            lens = torch.randint(lo, hi + 1, (rows,), generator=g).to(torch.int32).to(DEVICE)
            q, tables = q_all[:rows].contiguous(), tables_all[:rows].contiguous()
            mean = round(lens.float().mean().item())
            uniform = torch.full_like(lens, mean)
            plan = decode_launch_plan(rows, heads[1], heads[2], fp8, args.table_tokens, sms,
                                      kv_bytes=1 if fp8 else 2)
            variants = {
                "as given": (lens, None, None),
                "longest first": (lens, longest_first(lens), None),
                "shortest first": (lens, torch.argsort(lens, stable=True), None),
                "uniform": (uniform, None, None),
            }
            for s in (2, 4):
                if s != plan[2]:
                    variants[f"as given, {s} splits"] = (lens, None, s)
                    variants[f"longest first, {s} splits"] = (lens, longest_first(lens), s)
            err = check_reference(q, layers[0], tables, lens) if not rows_out else None
            t = time_case(q, layers, tables, lens, heads, fp8, variants)
            case = {"rows": rows, "range": [lo, hi], "mean": mean, "splits": plan[2],
                    "warp_tiles": plan[1], "reference_error": err,
                    "us": {k: v[0] for k, v in t.items()}, "tbps": {k: v[1] for k, v in t.items()}}
            results["cases"].append(case)
            rows_out.append(case)
            print(json.dumps(case), flush=True)
    if args.nanovllm_steps:
        ins, outs = nanovllm_lengths()
        total = {"as given": 0.0, "longest first": 0.0}
        for t in range(0, max(outs), args.nanovllm_steps):
            idx = [i for i in range(256) if outs[i] > t]
            lens = torch.tensor([ins[i] + t + 1 for i in idx], dtype=torch.int32, device=DEVICE)
            rows = len(idx)
            q, tables = q_all[:rows].contiguous(), tables_all[:rows].contiguous()
            res = time_case(q, layers, tables, lens, heads, fp8,
                            {"as given": (lens, None, None),
                             "longest first": (lens, longest_first(lens), None)})
            step = {"step": t, "rows": rows, "us": {k: v[0] for k, v in res.items()}}
            for k in total:
                total[k] += res[k][0] * args.nanovllm_steps
            results["nanovllm"].append(step)
            print(json.dumps(step), flush=True)
        results["nanovllm_total_us_per_layer"] = total
    with open(os.path.join(args.out, "decode_row_order.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{results['device']}, {args.heads} heads, {'fp8' if fp8 else 'bf16'} cache, "
          f"table {args.table_tokens} tokens; us per layer (TB/s of K/V read)")
    print("| rows | lengths | splits | as given | longest first | shortest first | uniform "
          "at mean | best split variant |")
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    for c in rows_out:
        us, bw = c["us"], c["tbps"]
        extra = {k: v for k, v in us.items() if "splits" in k}
        best = min(extra, key=extra.get) if extra else None
        def cell(k, us=us, bw=bw):
            return f"{us[k]:.1f} ({bw[k]:.2f})"
        print(f"| {c['rows']} | {c['range'][0]}-{c['range'][1]} | {c['splits']} | "
              f"{cell('as given')} | {cell('longest first')} | {cell('shortest first')} | "
              f"{cell('uniform')} | {best + ': ' + cell(best) if best else '-'} |")
    if args.nanovllm_steps:
        tot = results["nanovllm_total_us_per_layer"]
        print(f"nano-vllm workload, every {args.nanovllm_steps}th step weighted: as given "
              f"{tot['as given'] / 1000:.2f} ms per layer per run, longest first "
              f"{tot['longest first'] / 1000:.2f} ({tot['longest first'] / tot['as given']:.3f}x)")


if __name__ == "__main__":
    main()
