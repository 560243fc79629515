"""Can a decode step overlap its memory-bound attention with its compute-bound projections by
running two halves of its rows on two CUDA streams? A probe for issue 16, not a benchmark of
record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/overlap_probe.py --out DIR \
        [--rows 256] [--context 576] [--layers 24]

Why: at 256 rows a Qwen2-0.5B decode step is device-bound and runs one kernel at a time:
attention reads the K/V at 2.4-3.4 TB/s (about 38% of the step) while the tensor cores idle,
then the cuBLAS projections (about 36%) run while most of the bandwidth idles. The honest
roofline's floor takes max(bytes time, FLOPs time) per step, which only overlapping the two
kinds of work can approach (BENCHMARKS.md, "The honest roofline").

What runs: `--layers` decoder layers of Qwen2-0.5B's shape (hidden 896, 14 / 2 heads x 64,
intermediate 4,864), random bf16 weights per layer, each layer's own paged K/V cache of
`--rows` sequences x `--context` tokens in shuffled blocks: RMSNorm, QKV projection (bias),
decode attention (`paged_attention_decode`, the engine's Triton kernel), O projection, the
residual add and RMSNorm, gate/up, SwiGLU's activation, down. No RoPE and no K/V write (a few
percent of a step). Variants, each a CUDA graph timed with `bench_ms`:

- `whole`: every row through each layer, one stream (what the engine runs);
- `halves, one stream`: the first half's layer, then the second half's, one stream;
- `halves, two streams`: each half's layers on its own stream, free to interleave;
- `ping-pong`: two streams locked half a layer apart with events: the second half starts a
  layer once the first half's attention of that layer is done, and the first half starts the
  next layer once the second half's attention is done, so one half's attention runs while the
  other half's projections do;
- `attention only` / `projections only`: `whole` with one part left out, for scale.

The halves' outputs are checked equal to each other's (same kernels on the same rows) and to
`whole`'s within bf16 tolerance before anything is timed. Prints a table; writes DIR/overlap.json.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

from pagedrt.bench.attention import BLOCK_SIZE, bench_ms
from pagedrt.ops.attention import paged_attention_decode
from pagedrt.ops.fused_triton import rms_norm_triton, silu_and_mul_triton

DTYPE = torch.bfloat16
DEVICE = "cuda"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 896, 14, 2, 64, 4864
EPS = 1e-6


def make_layer(rows: int, context: int, gen: torch.Generator) -> dict:
    """One layer's weights and paged K/V cache (shuffled blocks, every sequence `context`
    tokens long)."""
    def w(*shape):
        return (torch.randn(*shape, generator=gen, device=DEVICE) * 0.02).to(DTYPE)
    qkv_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = rows * blocks_per_seq
    cache_shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    return {
        "norm1": torch.ones(HIDDEN, device=DEVICE, dtype=DTYPE),
        "norm2": torch.ones(HIDDEN, device=DEVICE, dtype=DTYPE),
        "qkv": w(qkv_out, HIDDEN), "qkv_bias": w(qkv_out), "o": w(HIDDEN, HEADS * HEAD_DIM),
        "gate_up": w(2 * INTER, HIDDEN), "down": w(HIDDEN, INTER),
        "k_cache": torch.randn(cache_shape, generator=gen, device=DEVICE).to(DTYPE),
        "v_cache": torch.randn(cache_shape, generator=gen, device=DEVICE).to(DTYPE),
        "block_tables": torch.randperm(num_blocks, generator=gen, device=DEVICE)
        .view(rows, blocks_per_seq).int(),
        "seq_lens": torch.full((rows,), context, dtype=torch.int32, device=DEVICE),
    }


def attention_part(x, residual, layer, rows: slice, attend: bool = True, project: bool = True):
    """RMSNorm, QKV and the decode attention of `rows`: (attention output [n, 896], the new
    residual)."""
    h, residual = (rms_norm_triton(x, layer["norm1"], EPS, residual) if residual is not None
                   else (rms_norm_triton(x, layer["norm1"], EPS), x))
    n = x.shape[0]
    if project:
        qkv = F.linear(h, layer["qkv"], layer["qkv_bias"])
        q = qkv[:, : HEADS * HEAD_DIM].view(n, HEADS, HEAD_DIM)
    else:
        q = h[:, : HEADS * HEAD_DIM].reshape(n, HEADS, HEAD_DIM)
    if not attend:
        return q.reshape(n, HEADS * HEAD_DIM), residual
    out = paged_attention_decode(q, layer["k_cache"], layer["v_cache"],
                                 layer["block_tables"][rows], layer["seq_lens"][rows],
                                 HEAD_DIM ** -0.5, validate=False)
    return out.reshape(n, HEADS * HEAD_DIM), residual


def mlp_part(attn, residual, layer, project: bool = True):
    """O projection, the residual add and RMSNorm, gate/up, SwiGLU, down: (x, residual) for
    the next layer."""
    if not project:
        return attn, residual
    o = F.linear(attn, layer["o"])
    h, residual = rms_norm_triton(o, layer["norm2"], EPS, residual)
    return F.linear(silu_and_mul_triton(F.linear(h, layer["gate_up"])), layer["down"]), residual


def run_whole(x, layers, rows: slice, attend=True, project=True):
    residual = None
    for layer in layers:
        attn, residual = attention_part(x, residual, layer, rows, attend, project)
        x, residual = mlp_part(attn, residual, layer, project)
    return x + residual


def run_halves_one_stream(x, layers, halves):
    xs, res = [x[h] for h in halves], [None, None]
    for layer in layers:
        for i, h in enumerate(halves):
            attn, res[i] = attention_part(xs[i], res[i], layer, h)
            xs[i], res[i] = mlp_part(attn, res[i], layer)
    return torch.cat([xs[i] + res[i] for i in range(2)])


def run_two_streams(x, layers, halves, streams, ping_pong: bool):
    """Each half on its own stream; with `ping_pong`, locked half a layer apart by events."""
    cur = torch.cuda.current_stream()
    outs = [None, None]
    for s in streams:
        s.wait_stream(cur)
    if not ping_pong:
        for i, (h, s) in enumerate(zip(halves, streams)):
            with torch.cuda.stream(s):
                outs[i] = run_whole(x[h], layers, h)
    else:
        xs, res = [x[h] for h in halves], [None, None]
        for layer in layers:
            done = []
            for i, (h, s) in enumerate(zip(halves, streams)):
                with torch.cuda.stream(s):
                    if i == 1:
                        s.wait_event(done[0])  # start after the first half's attention
                    attn, res[i] = attention_part(xs[i], res[i], layer, h)
                    event = torch.cuda.Event()
                    event.record(s)
                    done.append(event)
                    if i == 0:
                        xs[0], res[0] = mlp_part(attn, res[0], layer)
                    else:
                        xs[1], res[1] = mlp_part(attn, res[1], layer)
            # the first half's next layer waits for the second half's attention of this one
            streams[0].wait_event(done[1])
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[i] = xs[i] + res[i]
    for s in streams:
        cur.wait_stream(s)
    return torch.cat(outs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--context", type=int, default=576)
    p.add_argument("--layers", type=int, default=24)
    args = p.parse_args(argv)
    if args.rows % 2:
        raise ValueError(f"--rows {args.rows}: give an even count (two halves)")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    layers = [make_layer(args.rows, args.context, gen) for _ in range(args.layers)]
    x = torch.randn(args.rows, HIDDEN, generator=gen, device=DEVICE).to(DTYPE)
    every = slice(0, args.rows)
    halves = [slice(0, args.rows // 2), slice(args.rows // 2, args.rows)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    variants = {
        "whole": lambda: run_whole(x, layers, every),
        "halves, one stream": lambda: run_halves_one_stream(x, layers, halves),
        "halves, two streams": lambda: run_two_streams(x, layers, halves, streams, False),
        "ping-pong": lambda: run_two_streams(x, layers, halves, streams, True),
        "attention only": lambda: run_whole(x, layers, every, project=False),
        "projections only": lambda: run_whole(x, layers, every, attend=False),
    }
    # checks first: the halves' variants agree bit for bit, and with `whole` within bf16
    ref = variants["halves, one stream"]()
    for name in ("halves, two streams", "ping-pong"):
        got = variants[name]()
        torch.cuda.synchronize()
        if not torch.equal(got, ref):
            raise SystemExit(f"{name}: differs from the halves on one stream by "
                             f"{(got.float() - ref.float()).abs().max().item():.3g}")
    whole = variants["whole"]().float()
    rel = ((whole - ref.float()).norm() / whole.norm()).item()
    if not rel < 2e-2:
        raise SystemExit(f"whole against halves: relative difference {rel:.3g}")
    kv_bytes = 2 * args.rows * args.context * KV_HEADS * HEAD_DIM * 2 * args.layers
    results = []
    for name, fn in variants.items():
        ms = bench_ms(fn)
        results.append({"variant": name, "ms": ms})
        print(f"{name:22s} {ms * 1e3:9.1f} us", flush=True)
    base = results[0]["ms"]
    os.makedirs(args.out, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(), "rows": args.rows, "context": args.context,
           "layers": args.layers, "kv_bytes": kv_bytes, "whole_vs_halves_rel": rel,
           "results": results}
    with open(os.path.join(args.out, "overlap.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\n{args.layers} layers, {args.rows} rows x {args.context} tokens, "
          f"{torch.cuda.get_device_name()} (K/V {kv_bytes / 1e9:.2f} GB a step)")
    print(f"{'variant':22s} {'us':>9s} {'/ whole':>8s}")
    for r in results:
        print(f"{r['variant']:22s} {r['ms'] * 1e3:9.1f} {r['ms'] / base:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
