"""Paged-attention kernel benchmark on one CUDA GPU: decode bandwidth, decode scaling, prefill.

    PYTHONPATH=$PWD python3 benchmarks/bench_attention.py --out DIR [--commit HASH] [--sweep]
    pagedrt bench attention --kv-cache-dtype fp8 [--decode-shapes llama3-8b:64:4096,...]

With --kv-cache-dtype fp8 every row reads an FP8 cache (float8 e4m3 with a float32 scale per
token and KV head, `pagedrt.ops.fp8`) and the same kernel over the bf16 cache it was quantized
from is timed beside it (the "bf16" peer; SDPA and the naive kernel are left out); bandwidth
counts the bytes actually read, scales included. --decode-shapes replaces the shape list and
the sweeps with the named decode shapes (MODEL:NUM_SEQS:CONTEXT, MODEL a key of
DECODE_HEADS) and the prefill row.

Peers, in the same run: our decode kernel with the split-K heuristic; the same with
num_splits=1; the naive v1 kernel (one program per query head); torch SDPA on contiguous
K/V with enable_gqa=True (flash or memory-efficient backend), the dense upper bound.
Decode bandwidth = bytes of K and V read once / kernel time. Times are medians of
triton.testing.do_bench over CUDA-graph replays (so host overhead is excluded, as in the
engine's graph-captured decode; the eager time of ours is recorded too); do_bench flushes
L2 before every run. Our decode kernel is also timed back to back (`bench_stream_ms`: many
calls in one graph, cycling over enough batches' worth of blocks, at least four, that no
call finds its K/V in L2; not for --window rows),
which leaves out the replay's launch latency that a one-call replay adds to a kernel of tens
of microseconds ("_stream" keys; the FP8 table's first columns). Writes DIR/attention.json and
DIR/attention_bandwidth.png; prints a table last.

With --window W (sliding-window attention, Mistral / Gemma 3 local layers) it runs the window
comparison instead: decode and prefill at --context tokens (32768) with the last W visible,
against the same context with full attention and against a W-token context with full
attention (the kernels skip the blocks before the window, so the first two should be close).
Writes DIR/attention_window.json.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pagedrt.bench.common import git_commit
from pagedrt.entrypoints.arg_parser import ArgumentParser
from pagedrt.kv.kv_cache import fp8_v_dim_major_requested
from pagedrt.ops import attention_triton as tri
from pagedrt.ops.fp8 import quantize_fp8
from pagedrt.ops.triton_utils import to_v_dim_major

DECODE_SHAPES = [  # (name, num_seqs, context, num_heads, num_kv_heads, head_dim)
    ("llama3-8b B64 L4096", 64, 4096, 32, 8, 128),
    ("llama3-8b B256 L1024", 256, 1024, 32, 8, 128),
    ("llama3-8b B8 L32768", 8, 32768, 32, 8, 128),
    ("qwen2-0.5b B64 L2048", 64, 2048, 14, 2, 64),
]
SCALING_BATCHES = [1, 2, 4, 8, 64, 256]
CONTEXT_SWEEP = [1024, 4096, 16384, 32768]  # at batch 8, llama3-8b heads
DECODE_HEADS = {"llama3-8b": (32, 8, 128), "qwen2-0.5b": (14, 2, 64)}  # q heads, kv heads, dim
BLOCK_SIZE = 16
DTYPE = torch.bfloat16


def bench_ms(fn, graph: bool = True) -> float:
    """Median ms of `fn`, replayed from a CUDA graph (as the engine runs decode) so that
    Python and launch overhead stay out of the kernel time; eager if capture fails."""
    import triton.testing

    fn()  # compile / warm up
    torch.cuda.synchronize()
    run = fn
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        except RuntimeError as e:
            print(f"graph capture failed ({str(e)[:60]}); timing eagerly")
    return triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")


def paged_inputs(num_seqs, context, num_heads, num_kv_heads, head_dim, copies=1):
    """Full-length sequences in shuffled blocks (a realistic scattered cache), `copies`
    batches' worth of them: block tables [copies, num_seqs, blocks_per_seq], each batch's
    blocks its own (`bench_stream_ms` cycles over them; a single call uses tables[0])."""
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = copies * num_seqs * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    bt = torch.randperm(num_blocks, device="cuda").view(copies, num_seqs, blocks_per_seq).int()
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device="cuda")
    query = torch.randn(num_seqs, num_heads, head_dim, device="cuda", dtype=DTYPE)
    return query, k_cache, v_cache, bt, seq_lens


STREAM_CALLS = 16  # calls per graph replay in `bench_stream_ms` (at least)
MAX_STREAM_COPIES = 64


def stream_copies(kv_bytes: int) -> int:
    """How many batches' worth of blocks `bench_stream_ms` cycles through for a call that
    reads kv_bytes: enough that the other copies read at least twice the GPU's L2 between
    two calls over one copy (so none finds its K/V in L2), at least 4, at most
    MAX_STREAM_COPIES."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(4, min(MAX_STREAM_COPIES, 1 + -(-2 * l2 // max(kv_bytes, 1))))


def bench_stream_ms(fn, tables: torch.Tensor) -> float | None:
    """Median ms per call of `fn(block_tables)` run back to back, as the layers of a captured
    decode step run it: one CUDA graph goes through `tables` ([copies, num_seqs,
    blocks_per_seq], each copy's blocks its own: `paged_inputs`, `stream_copies`) as many
    times as give at least STREAM_CALLS calls, and triton.testing.do_bench times replays of
    that graph (median), divided by the calls. None if the graph cannot be captured.

    Against `bench_ms`, which times one call per replay after flushing L2: the replay's
    launch latency (several microseconds, which a graph of many kernels pays once) is spread
    over all the calls, and the caches still stay out of L2 between calls.
    """
    import triton.testing

    for bt in tables:  # compile / warm up
        fn(bt)
    torch.cuda.synchronize()
    rounds = -(-STREAM_CALLS // len(tables))
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(tables[0])
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(rounds):
                for bt in tables:
                    fn(bt)
    except RuntimeError as e:
        print(f"graph capture failed ({str(e)[:60]}); no back-to-back time")
        return None
    ms = triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median")
    return ms / (rounds * len(tables))


def fp8_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 cache [num_blocks, block_size, heads, dim] quantized as the engine writes it:
    (float8_e4m3fn cache of the same shape, scales [num_blocks, heads, block_size] fp32)."""
    num_blocks, block_size, heads, dim = cache.shape
    values, scales = quantize_fp8(cache.view(-1, heads, dim))
    return (values.view(cache.shape),
            scales.view(num_blocks, block_size, heads).transpose(1, 2).contiguous())


def parse_decode_shapes(spec: str) -> list[tuple]:
    """"llama3-8b:64:4096,qwen2-0.5b:64:4096" -> DECODE_SHAPES-style tuples.

    Raises:
        ValueError: an entry is not MODEL:NUM_SEQS:CONTEXT with MODEL in DECODE_HEADS.
    """
    shapes = []
    for entry in filter(None, spec.split(",")):
        parts = entry.split(":")
        if len(parts) != 3 or parts[0] not in DECODE_HEADS or not all(
                p.isdigit() for p in parts[1:]):
            raise ValueError(f"decode shape {entry!r}: expected MODEL:NUM_SEQS:CONTEXT with "
                             f"MODEL one of {sorted(DECODE_HEADS)}")
        model, num_seqs, context = parts[0], int(parts[1]), int(parts[2])
        shapes.append((f"{model} B{num_seqs} L{context}", num_seqs, context,
                       *DECODE_HEADS[model]))
    return shapes


def sdpa_decode_ms(num_seqs, context, num_heads, num_kv_heads, head_dim) -> float | None:
    q = torch.randn(num_seqs, num_heads, 1, head_dim, device="cuda", dtype=DTYPE)
    k = torch.randn(num_seqs, num_kv_heads, context, head_dim, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                def fn():
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

                fn()
                return bench_ms(fn)
        except RuntimeError:
            continue
    return None


def decode_row(name, num_seqs, context, num_heads, num_kv_heads, head_dim, peers=True,
               sweep=False, window=None, kv_cache_dtype="auto") -> dict:
    """window: sliding window in tokens (the K/V bytes counted are those of the window).
    kv_cache_dtype "fp8": an FP8 cache, timed against the bf16 cache it was quantized from."""
    seen = min(context, window or context)  # tokens each query reads
    fp8 = kv_cache_dtype == "fp8"
    # back to back only without a window (the window table prints one-call times); the
    # copies by the smaller (FP8) cache's bytes where both are timed
    copies = 1 if window else stream_copies(
        2 * num_seqs * context * num_kv_heads * (head_dim + 4 if fp8 else 2 * head_dim))
    query, k_cache, v_cache, tables, seq_lens = paged_inputs(
        num_seqs, context, num_heads, num_kv_heads, head_dim, copies=copies)
    bt = tables[0]
    bf16_bytes = 2 * num_seqs * seen * num_kv_heads * head_dim * k_cache.element_size()
    scales = {}
    if fp8:
        bf16_k, bf16_v = k_cache, v_cache
        k_cache, scales["k_scales"] = fp8_cache(bf16_k)
        v_cache, scales["v_scales"] = fp8_cache(bf16_v)
        if fp8_v_dim_major_requested():  # V as the engine would store it
            v_cache = to_v_dim_major(v_cache)
        # one byte per element plus a 4-byte scale per token and KV head, K and V
        kv_bytes = 2 * num_seqs * seen * num_kv_heads * (head_dim + 4)
    else:
        kv_bytes = bf16_bytes
    scale = head_dim ** -0.5
    auto_splits = tri.decode_launch_plan(  # as the launch picks it
        num_seqs, num_kv_heads, head_dim, fp8, seen,
        torch.cuda.get_device_properties(0).multi_processor_count, sliding_window=window)[2]
    row = {"kind": "decode", "shape": name, "num_seqs": num_seqs, "context": context,
           "num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
           "dtype": "bf16", "kv_cache_dtype": "fp8_e4m3" if fp8 else "bf16",
           "block_size": BLOCK_SIZE, "kv_bytes": kv_bytes, "auto_splits": auto_splits,
           "window": window}

    def record(key, ms, nbytes=kv_bytes):
        row[f"{key}_ms"] = ms
        row[f"{key}_gbps"] = nbytes / (ms * 1e-3) / 1e9 if ms else None

    record("ours", bench_ms(lambda: tri.paged_attention_decode_triton(
        query, k_cache, v_cache, bt, seq_lens, scale, max_seq_len=context,
        sliding_window=window, **scales)))
    row["ours_tok_per_s"] = num_seqs / (row["ours_ms"] * 1e-3)
    row["ours_eager_ms"] = bench_ms(lambda: tri.paged_attention_decode_triton(
        query, k_cache, v_cache, bt, seq_lens, scale, max_seq_len=context,
        sliding_window=window, **scales), graph=False)

    def stream_ms(k, v, **kv_scales) -> float | None:  # back to back over k, v (no window)
        return bench_stream_ms(lambda t: tri.paged_attention_decode_triton(
            query, k, v, t, seq_lens, scale, max_seq_len=context, **kv_scales),
            tables) if copies > 1 else None

    row["stream_copies"] = copies if copies > 1 else None
    record("ours_stream", stream_ms(k_cache, v_cache, **scales))
    if fp8:  # the same kernel over the bf16 cache these values came from
        record("bf16", bench_ms(lambda: tri.paged_attention_decode_triton(
            query, bf16_k, bf16_v, bt, seq_lens, scale, max_seq_len=context,
            sliding_window=window)), bf16_bytes)
        record("bf16_stream", stream_ms(bf16_k, bf16_v), bf16_bytes)
        row["bf16_kv_bytes"] = bf16_bytes
        row["time_vs_bf16"] = row["ours_ms"] / row["bf16_ms"]
        row["stream_time_vs_bf16"] = (row["ours_stream_ms"] / row["bf16_stream_ms"]
                                      if row["ours_stream_ms"] and row["bf16_stream_ms"]
                                      else None)
        record("split1", bench_ms(lambda: tri.paged_attention_decode_triton(
            query, k_cache, v_cache, bt, seq_lens, scale, num_splits=1,
            sliding_window=window, **scales)))
        peers = sweep = False
    if peers:
        record("split1", bench_ms(lambda: tri.paged_attention_decode_triton(
            query, k_cache, v_cache, bt, seq_lens, scale, num_splits=1)))
        record("naive", bench_ms(lambda: tri.paged_attention_decode_naive_triton(
            query, k_cache, v_cache, bt, seq_lens, scale)))
        record("sdpa", sdpa_decode_ms(num_seqs, context, num_heads, num_kv_heads, head_dim))
    if sweep:  # tuning data: every split count and a few launch configs
        row["sweep_splits"] = {}
        for ns in (1, 2, 4, 8, 16):
            ms = bench_ms(lambda ns=ns: tri.paged_attention_decode_triton(
                query, k_cache, v_cache, bt, seq_lens, scale, num_splits=ns))
            row["sweep_splits"][ns] = kv_bytes / (ms * 1e-3) / 1e9
        best = max(row["sweep_splits"], key=row["sweep_splits"].get)
        row["sweep_configs"] = {}
        for bn, nw, st in [(64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 4, 4)]:
            cfg = {"BLOCK_N": bn, "num_warps": nw, "num_stages": st}
            try:
                ms = bench_ms(lambda cfg=cfg: tri.paged_attention_decode_triton(
                    query, k_cache, v_cache, bt, seq_lens, scale, num_splits=best, config=cfg))
                row["sweep_configs"][f"{bn}/{nw}/{st}@{best}"] = kv_bytes / (ms * 1e-3) / 1e9
            except Exception as e:  # noqa: BLE001 (out of shared memory etc.)
                row["sweep_configs"][f"{bn}/{nw}/{st}@{best}"] = repr(e)[:80]
    torch.cuda.empty_cache()  # the caches are freed when this frame returns
    return row


def extend_row(sweep=False, num_tokens=4096, num_heads=32, num_kv_heads=8, head_dim=128,
               window=None, peers=True, kv_cache_dtype="auto") -> dict:
    """window: sliding window in tokens (FLOPs counted over the keys each query sees).
    kv_cache_dtype "fp8": an FP8 cache (V as the engine stores it), timed against the bf16
    cache it was quantized from: "ours" as the engine prefills a prompt, its keys read from
    the step's K/V rows the writer left as the cache holds them (FRESH_CHUNK_KV, no window),
    and "from_cache" reading every key from the FP8 cache (what a chunk's cached prefix
    costs)."""
    query, k_cache, v_cache, tables, seq_lens = paged_inputs(1, num_tokens, num_heads,
                                                             num_kv_heads, head_dim)
    bt = tables[0]
    query = torch.randn(num_tokens, num_heads, head_dim, device="cuda", dtype=DTYPE)
    cu = torch.tensor([0, num_tokens], dtype=torch.int32, device="cuda")
    scale = head_dim ** -0.5
    pairs = num_tokens * num_tokens / 2  # causal: half the matrix
    if window is not None and window < num_tokens:  # the pairs within the window
        pairs = num_tokens * window - window * (window - 1) / 2
    flops = 4 * pairs * head_dim * num_heads
    fp8 = kv_cache_dtype == "fp8"
    row = {"kind": "extend", "shape": f"prefill {num_tokens} tok {num_heads}/{num_kv_heads}x"
           f"{head_dim}" + (f" window {window}" if window else ""), "num_tokens": num_tokens,
           "dtype": "bf16", "kv_cache_dtype": "fp8_e4m3" if fp8 else "bf16",
           "block_size": BLOCK_SIZE, "flops": flops, "window": window}
    if fp8:
        bf16_ms = bench_ms(lambda: tri.paged_attention_extend_triton(
            query, k_cache, v_cache, bt, cu, seq_lens, scale, max_query_len=num_tokens,
            sliding_window=window))
        row["bf16_ms"], row["bf16_tflops"] = bf16_ms, flops / (bf16_ms * 1e-3) / 1e12
        (k_cache, k_scales), (v_cache, v_scales) = fp8_cache(k_cache), fp8_cache(v_cache)
        if fp8_v_dim_major_requested():
            v_cache = to_v_dim_major(v_cache)
        # the prompt's rows as the writer leaves them: the cache's values in bf16
        blocks = bt[0].long()
        key, value = ((c[blocks].float() * s[blocks].transpose(1, 2)[..., None]).flatten(0, 1)
                      [:num_tokens].to(DTYPE) for c, s in ((k_cache, k_scales),
                                                           (v_cache, v_scales)))
        scales = {"k_scales": k_scales, "v_scales": v_scales}
        ms = bench_ms(lambda: tri.paged_attention_extend_triton(
            query, k_cache, v_cache, bt, cu, seq_lens, scale, max_query_len=num_tokens,
            sliding_window=window, key=key, value=value, **scales))
        row["ours_ms"], row["ours_tflops"] = ms, flops / (ms * 1e-3) / 1e12
        ms = bench_ms(lambda: tri.paged_attention_extend_triton(
            query, k_cache, v_cache, bt, cu, seq_lens, scale, max_query_len=num_tokens,
            sliding_window=window, **scales))
        row["from_cache_ms"], row["from_cache_tflops"] = ms, flops / (ms * 1e-3) / 1e12
        row["sdpa_ms"] = row["sdpa_tflops"] = row["ratio_vs_sdpa"] = None
        return row
    ms = bench_ms(lambda: tri.paged_attention_extend_triton(
        query, k_cache, v_cache, bt, cu, seq_lens, scale, max_query_len=num_tokens,
        sliding_window=window))
    row["ours_ms"], row["ours_tflops"] = ms, flops / (ms * 1e-3) / 1e12
    if not peers:
        return row
    q = query.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    k = torch.randn(1, num_kv_heads, num_tokens, head_dim, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        try:
            fn()
            sdpa_ms = bench_ms(fn)
        except RuntimeError:
            sdpa_ms = None
    row["sdpa_ms"] = sdpa_ms
    row["sdpa_tflops"] = flops / (sdpa_ms * 1e-3) / 1e12 if sdpa_ms else None
    row["ratio_vs_sdpa"] = row["ours_tflops"] / row["sdpa_tflops"] if sdpa_ms else None
    if sweep:
        row["sweep_configs"] = {}
        for bm, bn, nw, st in [(128, 64, 8, 3), (256, 64, 8, 3), (256, 32, 8, 3),
                               (256, 64, 8, 2), (256, 128, 8, 2)]:
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": st}
            try:
                ms = bench_ms(lambda cfg=cfg: tri.paged_attention_extend_triton(
                    query, k_cache, v_cache, bt, cu, seq_lens, scale, max_query_len=num_tokens,
                    config=cfg))
                row["sweep_configs"][f"{bm}/{bn}/{nw}/{st}"] = flops / (ms * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001
                row["sweep_configs"][f"{bm}/{bn}/{nw}/{st}"] = repr(e)[:80]
    return row


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, group, xkey in ((ax1, "scaling", "num_seqs"), (ax2, "context", "context")):
        rows = [r for r in results if r.get("group") == group]
        for key, label in (("ours", "ours (auto split-K)"), ("split1", "ours, num_splits=1"),
                           ("bf16", "ours, bf16 cache"), ("naive", "naive v1"),
                           ("sdpa", "torch SDPA, dense KV")):
            if not any(r.get(f"{key}_gbps") for r in rows):
                continue  # not measured in this mode
            ax.plot([r[xkey] for r in rows], [(r.get(f"{key}_gbps") or 0) for r in rows],
                    marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_ylabel("K+V bandwidth (GB/s)")
        ax.grid(True, alpha=0.3)
    ax1.set_xlabel("batch size (context 512)")
    ax2.set_xlabel("context length (batch 8)")
    ax1.set_title("decode, Llama-3-8B heads 32/8x128, bf16")
    ax2.set_title("decode, Llama-3-8B heads 32/8x128, bf16")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _gb(row: dict, key: str) -> str:
    value = row.get(f"{key}_gbps")
    return f"{value:8.0f}" if value else f"{'-':>8}"


def format_or_dash(value, spec: str, scale: float = 1.0) -> str:
    """value * scale formatted by spec, or "-" as wide when value is None (a time not taken)."""
    if value is None:
        return "-".rjust(int(spec.split(".")[0] or 0))
    return format(value * scale, spec)


def print_fp8_table(results: list[dict]) -> None:
    """Decode rows twice: back to back (`bench_stream_ms`), then one call per replay after an
    L2 flush (`bench_ms`)."""
    print(f"{'decode shape, fp8 cache':26} {'split':>5} {'fp8 GB/s':>9} {'fp8 us':>8} "
          f"{'bf16 GB/s':>9} {'bf16 us':>8} {'time fp8/bf16':>13}  (back to back | one call)")
    for r in results:
        if r["kind"] == "decode":
            num = format_or_dash
            print(f"{r['shape'][:26]:26} {r['auto_splits']:>5} "
                  f"{num(r['ours_stream_gbps'], '9.0f')} {num(r['ours_stream_ms'], '8.1f', 1e3)} "
                  f"{num(r['bf16_stream_gbps'], '9.0f')} {num(r['bf16_stream_ms'], '8.1f', 1e3)} "
                  f"{num(r['stream_time_vs_bf16'], '13.3f')} | "
                  f"{r['ours_ms'] * 1e3:.1f} / {r['bf16_ms'] * 1e3:.1f} us = "
                  f"{r['time_vs_bf16']:.3f}")
        else:
            print(f"{r['shape']}: fp8 cache {r['ours_tflops']:.0f} TFLOP/s ({r['ours_ms']:.3f} "
                  f"ms), bf16 cache {r['bf16_tflops']:.0f} TFLOP/s ({r['bf16_ms']:.3f} ms)")


def print_tables(results: list[dict]) -> None:
    if results and results[0].get("kv_cache_dtype") == "fp8_e4m3":
        print_fp8_table(results)
        return
    print(f"{'decode shape':26} {'split':>5} {'ours GB/s':>10} {'split1':>8} {'naive':>8} "
          f"{'sdpa':>8} {'ours us':>8} {'eager us':>8} {'tok/s':>10} {'back-to-back us':>15}")
    for r in results:
        if r["kind"] != "decode":
            continue
        label = r["shape"] if r.get("group") in (None, "shape") else f"{r['group']} {r['shape']}"

        print(f"{label[:26]:26} {r['auto_splits']:>5} {r['ours_gbps']:10.0f} {_gb(r, 'split1')} "
              f"{_gb(r, 'naive')} {_gb(r, 'sdpa')} {r['ours_ms'] * 1e3:8.1f} "
              f"{r['ours_eager_ms'] * 1e3:8.1f} {r['ours_tok_per_s']:10.0f} "
              f"{format_or_dash(r['ours_stream_ms'], '15.1f', 1e3)}")
    for r in results:
        for key in ("sweep_splits", "sweep_configs"):
            if key in r:
                vals = ", ".join(f"{k}:{v:.0f}" if isinstance(v, float) else f"{k}:ERR"
                                 for k, v in r[key].items())
                print(f"  {r['shape'][:22]} {key}: {vals}")
    for r in results:
        if r["kind"] == "extend" and r.get("from_cache_ms") is not None:
            print(f"{r['shape']} over FP8: ours {r['ours_tflops']:.0f} TFLOP/s "
                  f"({r['ours_ms']:.3f} ms), every key from the FP8 cache "
                  f"{r['from_cache_tflops']:.0f} ({r['from_cache_ms']:.3f} ms), bf16 cache "
                  f"{r['bf16_tflops']:.0f} ({r['bf16_ms']:.3f} ms)")
        elif r["kind"] == "extend":
            print(f"{r['shape']}: ours {r['ours_tflops']:.0f} TFLOP/s ({r['ours_ms']:.3f} ms), "
                  f"torch SDPA flash {r['sdpa_tflops'] or 0:.0f} TFLOP/s, ratio "
                  f"{r['ratio_vs_sdpa'] or 0:.2f}")


WINDOW_BATCHES = [1, 8, 32]  # decode batch sizes of the window comparison


def window_rows(window: int, context: int) -> list[dict]:
    """Decode at `context` with the window, at `context` in full, and at a `window`-token
    context in full (Mistral-7B's heads: 32/8 x 128, bf16); then the same three prefills."""
    rows = []
    for b in WINDOW_BATCHES:
        for label, ctx, w in ((f"L{context} window {window}", context, window),
                              (f"L{context} full", context, None),
                              (f"L{window} full", window, None)):
            row = decode_row(f"B{b} {label}", b, ctx, 32, 8, 128, peers=False, window=w)
            row["group"] = "window"
            rows.append(row)
    for ctx, w in ((context, window), (context, None), (window, None)):
        rows.append(extend_row(num_tokens=ctx, window=w, peers=False))
    return rows


def print_window_table(rows: list[dict]) -> None:
    print(f"{'decode':34} {'split':>5} {'us':>9} {'GB/s (seen)':>12}")
    for r in rows:
        if r["kind"] == "decode":
            print(f"{r['shape']:34} {r['auto_splits']:>5} {r['ours_ms'] * 1e3:9.1f} "
                  f"{r['ours_gbps']:12.0f}")
    print(f"{'prefill':34} {'':>5} {'ms':>9} {'TFLOP/s':>12}")
    for r in rows:
        if r["kind"] == "extend":
            print(f"{r['shape']:34} {'':>5} {r['ours_ms']:9.3f} {r['ours_tflops']:12.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="pagedrt bench attention",
                            description="paged attention kernel benchmark (CUDA)")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    parser.add_argument("--commit", default=None,
                        help="recorded in the JSON (default: $PAGEDRT_COMMIT, else git's HEAD)")
    parser.add_argument("--sweep", action="store_true", help="also sweep split counts/configs")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                        help="auto: bf16 caches; fp8: FP8 caches, each row timed against the "
                             "bf16 cache too")
    parser.add_argument("--decode-shapes", default="",
                        help="only these decode shapes (and the prefill row), e.g. "
                             "llama3-8b:64:4096,qwen2-0.5b:64:4096")
    parser.add_argument("--window", type=int, default=None,
                        help="run the sliding-window comparison with this window (tokens) "
                             "instead of the default set")
    parser.add_argument("--context", type=int, default=32768,
                        help="context of the --window comparison (tokens)")
    args = parser.parse_args(argv)
    args.commit = args.commit or os.environ.get("PAGEDRT_COMMIT") or git_commit()
    if not torch.cuda.is_available():
        print("bench attention needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.window is not None and not 1 <= args.window <= args.context:
        parser.error(f"--window {args.window}: give 1 .. --context ({args.context}) tokens")
    torch.manual_seed(0)
    if args.window is not None:
        rows = window_rows(args.window, args.context)
        os.makedirs(args.out, exist_ok=True)
        doc = {"gpu": torch.cuda.get_device_name(0), "commit": args.commit,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                   timespec="seconds"),
               "command": "pagedrt bench attention " + " ".join(argv or sys.argv[1:]),
               "torch": torch.__version__, "triton": __import__("triton").__version__,
               "window": args.window, "context": args.context, "results": rows}
        with open(os.path.join(args.out, "attention_window.json"), "w") as f:
            json.dump(doc, f, indent=1)
        print_window_table(rows)
        return 0
    kv = args.kv_cache_dtype
    shapes = parse_decode_shapes(args.decode_shapes) if args.decode_shapes else DECODE_SHAPES
    results = []
    for shape in shapes:
        row = decode_row(*shape, sweep=args.sweep, kv_cache_dtype=kv)
        row["group"] = "shape"
        results.append(row)
    if not args.decode_shapes:
        for b in SCALING_BATCHES:
            row = decode_row(f"B{b} L512", b, 512, 32, 8, 128, kv_cache_dtype=kv)
            row["group"] = "scaling"
            results.append(row)
        for ctx in CONTEXT_SWEEP:
            row = decode_row(f"B8 L{ctx}", 8, ctx, 32, 8, 128, kv_cache_dtype=kv)
            row["group"] = "context"
            results.append(row)
    results.append(extend_row(sweep=args.sweep, kv_cache_dtype=kv))
    os.makedirs(args.out, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(0), "commit": args.commit,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python3 benchmarks/bench_attention.py " + " ".join(argv or sys.argv[1:]),
           "torch": torch.__version__, "triton": __import__("triton").__version__,
           "results": results}
    name = "attention" if kv == "auto" else f"attention_{kv}"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    if not args.decode_shapes:
        plot(results, os.path.join(args.out, f"{name}_bandwidth.png"))
    print_tables(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
