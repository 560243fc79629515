"""Triton paged-attention decode kernels (one query token per sequence).

Same signatures as `attention_reference.py`. The extend (prefill) kernel lives in
`attention_extend_triton.py`, the naive v1 decode baseline in `attention_decode_naive_triton.py`,
the K/V movers in `kv_write_triton.py`; all are re-exported here. The warp-tile decode kernel
(`attention_decode_warp_triton.py`; the default over an FP8 cache, and over a 16-bit one at
head_dim 64 where the launch splits; the launch config's "warp_tiles") is launched from
`paged_attention_decode_triton` with the same arguments.

Decode, GQA-aware with split-K ("flash-decoding"):

    grid = (num_kv_heads, num_splits, num_seqs)
    program (kv_head, split, seq): the GROUP query heads of kv_head, padded to GROUP_PAD >= 16
    rows for tl.dot, over the tokens of partition `split` of the sequence:

      seq_len tokens: |<- part_len ->|<- part_len ->|<- part_len ->|...   part_len = BLOCK_N *
                      |   split 0    |   split 1    |  split 2 (.)  |     cdiv(cdiv(seq_len,
                                                                          num_splits), BLOCK_N)
      each partition walks BLOCK_N-token tiles; token t lives in physical block
      block_tables[seq, t // block_size] at offset t % block_size.

Each program runs a single-pass online softmax (Milkman & Gimelshein 2018; FlashAttention,
Dao et al. 2022) in fp32. With num_splits == 1 it writes the output directly; otherwise it
writes its normalised partial output and log-sum-exp, and `_decode_reduce_kernel` combines
the partitions weighted by exp(lse_i - max lse). Partitions past a short sequence's end are
empty (lse = -inf, weight 0), so any num_splits is valid for any mix of lengths.

Folding the combine into the split kernel (its last program per (sequence, KV head) combining,
on arrival counters) and loading each tile's block ids a tile ahead were built and measured
slower on the H200, and removed (docs/design.md, "Decode attention: measured, not kept").

Sliding window (WINDOW > 0, a constexpr: 0 compiles the full-attention kernel unchanged): the
query at position seq_len - 1 sees keys [lo, seq_len) with lo = max(seq_len - WINDOW, 0), and
the partitions split that range instead of [0, seq_len), so blocks before the window are never
read (nor their block-table entries, which may be stale: the KV manager has given those blocks
back to the pool, docs/design.md). A decode at context 32k with a 4k window reads what one at
context 4k reads.

Unused slots (past seq_len in the last block) and other sequences' blocks may hold NaN: every
K/V load is masked with other=0 and every masked score is set to -inf before the softmax, so
such data is never read into the arithmetic.

FP8 cache (KV_FP8, `pagedrt.ops.fp8`): K and V tiles are loaded as fp8 (half the bytes of
bf16) and converted in registers to the query's dtype (exact: every e4m3 value is a bf16,
fp16 and fp32 value). Their per-token scales are applied to the small [GROUP_PAD, BLOCK_N]
tiles instead of the [BLOCK_N, HEAD_DIM] ones: q . (k * s_k) = (q . k) * s_k scales the score
columns, and p @ (v * s_v) = (p * s_v) @ v scales the probability columns (divided by the
tile's largest s_v, which multiplies the product instead, so that p * s_v stays in fp16's
range). Over a 16-bit query the products run in fp16 (F16_MMA): e4m3 -> fp16 is one
conversion per two values on Hopper, where e4m3 -> bf16 takes four (through fp16 and fp32),
and those conversions, not memory, bounded a bf16-operand version of this kernel at about
1.5 TB/s on the H200 (benchmarks/results/RUNS.md, "Tensor parallelism (TP = 1), FP8 KV cache,
sliding window, beam search: first H200 runs", call 4). Every e4m3 value is an fp16 value;
the query is cast after a division by 64 (exact; the scores are multiplied back), which keeps
any |q| below 4 million finite. An FP8 cache's V is stored dim-major by default
(`KVCacheSpec.v_dim_major`: tokens contiguous within a block per head and dim; not for
sliding-window models), and V_DIM_MAJOR loads its tiles as [HEAD_DIM, BLOCK_N] along tokens and
hands the product their transpose: 230 us against 262 us with V in K's layout on the H200
(Llama-3-8B heads, B64 L4096; docs/design.md, "FP8 KV cache"). A load masked per token, against
a seq_len loaded from memory (its alignment unknown to the compiler), cannot be vectorized
along the masked dimension, and in the dim-major layout that dimension is the contiguous one,
so each thread would read its V bytes one by one (128 ld.global.b8 per tile; found in the PTX
compiled for sm_90 without a GPU, benchmarks/diagnostics/decode_ptx.py). With V_DIM_MAJOR the
kernel runs the full tiles of a partition unmasked (`_decode_tile` with MASKED False: V by
16-byte asynchronous copies) and masks only the last, partial one. The other paths keep one
masked loop (their masks cut across the contiguous dimension).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.attention_decode_naive_triton import paged_attention_decode_naive_triton
from pagedrt.ops.attention_decode_warp_triton import _decode_warp_kernel, warp_tile_shape
from pagedrt.ops.attention_extend_triton import (
    fp8_scaled_pv,
    online_softmax_step,
    paged_attention_extend_triton,
)
from pagedrt.ops.fp8 import is_fp8
from pagedrt.ops.kv_write_triton import copy_blocks_triton, write_kv_triton
from pagedrt.ops.triton_utils import (
    LOG2E,
    check_decode_args,
    check_sliding_window,
    device_sms,
    interpreting,
    launch_first_fitting,
    load_group_query,
    next_pow2,
    pdl_enabled,
    pdl_launch,
    pdl_prologue,
    tile_load,
    v_dim_major,
)

# `_decode_kernel`'s shortest split-K partition: a shorter one costs more than it hides (the
# FP8 cache's warp tiles go down to 64: `_decode_launch_config`)
MIN_PARTITION_TOKENS = 256
MAX_SPLITS = 64
# fp32 partials one `_decode_reduce_kernel` program combines at most (64 per thread at 4 warps)
REDUCE_TILE_ELEMENTS = 8192


@triton.jit
def _decode_tile(
    m_i, l_i, acc,  # [GROUP_PAD], [GROUP_PAD], [GROUP_PAD, HEAD_DIM] fp32: the running state
    tile_start, end,  # this tile's first token; the partition's end (exclusive)
    q, bt_row, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, kv_head, head_off,
    scale_log2, stride_cb, stride_cs, stride_vb, stride_vs, stride_vh, stride_sb, stride_sh,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
    V_DIM_MAJOR: tl.constexpr,
    MASKED: tl.constexpr,  # False: every token of the tile is below `end` (no load masked)
):
    """One BLOCK_N-token tile of `_decode_kernel`'s online softmax; returns the new state."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tile_start + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    block = tile_load(bt_row + offs_n // BLOCK_SIZE, n_mask, MASKED).to(tl.int64)
    kv_off = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + head_off
    k = tile_load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], n_mask[:, None], MASKED)
    if UPCAST:
        k = k.to(tl.float32)
    if KV_FP8:
        k = k.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    if KV_FP8:
        scale_off = block * stride_sb + kv_head * stride_sh + offs_n % BLOCK_SIZE
        s = s * tile_load(k_scales_ptr + scale_off, n_mask, MASKED)[None, :]
    if MASKED:
        s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new, p, alpha, l_i = online_softmax_step(m_i, l_i, s)
    # unit and BLOCK_SIZE strides written as literals: Triton does not specialize an int
    # argument on 1, and a runtime stride loses the 16-byte loads (benchmarks/results/RUNS.md,
    # "Evening runs of 2026-12-01 (21:37-21:48 UTC)")
    if V_DIM_MAJOR:  # tokens contiguous: load [HEAD_DIM, BLOCK_N], use its transpose
        v_off = block * stride_vb + kv_head * stride_vh + offs_n % BLOCK_SIZE
        v = tl.trans(tile_load(v_cache_ptr + v_off[None, :] + offs_d[:, None] * BLOCK_SIZE,
                           n_mask[None, :], MASKED))
    else:
        v_off = block * stride_vb + (offs_n % BLOCK_SIZE) * stride_vs + kv_head * stride_vh
        v = tile_load(v_cache_ptr + v_off[:, None] + offs_d[None, :], n_mask[:, None], MASKED)
    if UPCAST:
        v = v.to(tl.float32)
    if KV_FP8:
        v = v.to(q.dtype)
        pv = fp8_scaled_pv(p, v, tile_load(v_scales_ptr + scale_off, n_mask, MASKED),
                           DOT_PRECISION)
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _combine_partials(part_out_ptr, part_lse_ptr, rows, row_mask, num_splits,
                      HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """The split-K combine of a block of (sequence, query head) pairs: for each, its
    num_splits partial outputs part_out[row:row + num_splits, :HEAD_DIM] (fp32, each
    normalised over its partition) and log-sum-exps part_lse[row:row + num_splits] (fp32,
    log2 domain; -inf for an empty partition, whose weight is then 0), with row = (seq *
    num_heads + head) * num_splits given per pair in `rows` [HEADS] (pairs where `row_mask`
    [HEADS] is False are not read), weighted by exp2(lse_i - max lse) / sum of the weights.
    Returns [HEADS, HEAD_DIM] fp32 (0 for a pair whose partitions are all empty, which a
    sequence of seq_len >= 1 never has)."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = row_mask[:, None] & (offs_s < num_splits)[None, :]  # [HEADS, SPLITS_PAD]
    idx = rows[:, None] + offs_s[None, :]
    lse = tl.load(part_lse_ptr + idx, mask=mask, other=float("-inf"))
    valid = lse > float("-inf")
    lse_max = tl.max(lse, 1)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # a masked pair: no -inf - -inf
    weight = tl.where(valid, tl.exp2(tl.where(valid, lse - lse_max[:, None], 0.0)), 0.0)
    part = tl.load(part_out_ptr + idx[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                   mask=mask[:, :, None], other=0.0)
    total = tl.sum(weight, 1)
    return tl.sum(part * weight[:, :, None], 1) / tl.where(total > 0, total, 1.0)[:, None]


@triton.jit
def _decode_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strides stride_v*
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    out_ptr,  # [num_seqs, num_heads, head_dim]; written when not SPLIT
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32; written when SPLIT
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32, log2 domain; written when SPLIT
    k_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; read when KV_FP8
    v_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; read when KV_FP8
    scale_log2,  # softmax scale * log2(e)
    stride_qs, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_vb, stride_vs, stride_vh, stride_vd,  # V's strides (block, slot, head, dim); the
    # kernel takes the unit one and stride_vd (1, or BLOCK_SIZE dim-major) as literals
    stride_sb, stride_sh,  # scale strides (block, head); the slot stride is 1
    stride_bt,
    stride_os, stride_oh,
    num_splits,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,  # tokens per KV tile
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot in fp32 (its bf16 dot is wrong)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 caches, else "tf32" (unused for 16-bit)
    KV_FP8: tl.constexpr,  # fp8 caches with per-token scales
    F16_MMA: tl.constexpr,  # KV_FP8 with a 16-bit query: products in fp16 (module doc)
    WINDOW: tl.constexpr = 0,  # sliding window in tokens; 0 = attend to every cached token
    V_DIM_MAJOR: tl.constexpr = False,  # V tiles read as [HEAD_DIM, BLOCK_N] (stride_vs 1)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (pdl_enabled)
):
    pdl_prologue(PDL)
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo = 0  # first key position the query sees
    if WINDOW > 0:
        lo = tl.maximum(seq_len - WINDOW, 0)
    part_len = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * part_len
    end = tl.minimum(start + part_len, seq_len)

    q, heads, g_mask, scale_log2 = load_group_query(
        q_ptr, seq, kv_head, stride_qs, stride_qh, scale_log2, GROUP, GROUP_PAD, HEAD_DIM,
        UPCAST, F16_MMA)
    offs_d = tl.arange(0, HEAD_DIM)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    head_off = kv_head * stride_ch
    # With V dim-major, the full tiles with no mask, then the partial one, if any, masked: a
    # per-token mask against the loaded seq_len (alignment unknown to the compiler) turns the
    # dim-major V load, contiguous along tokens, into byte loads (module doc). Otherwise one
    # masked loop (those masks cut across the contiguous head_dim).
    loop_end = end
    if V_DIM_MAJOR:
        loop_end = start + (end - start) // BLOCK_N * BLOCK_N
    for tile_start in range(start, loop_end, BLOCK_N):
        m_i, l_i, acc = _decode_tile(
            m_i, l_i, acc, tile_start, end, q, bt_row, k_cache_ptr, v_cache_ptr, k_scales_ptr,
            v_scales_ptr, kv_head, head_off, scale_log2, stride_cb, stride_cs, stride_vb,
            stride_vs, stride_vh, stride_sb, stride_sh, BLOCK_SIZE, HEAD_DIM, BLOCK_N, UPCAST,
            DOT_PRECISION, KV_FP8, V_DIM_MAJOR, not V_DIM_MAJOR)
    if V_DIM_MAJOR:  # noqa: SIM102 - a constexpr test, then a runtime one
        if loop_end < end:
            m_i, l_i, acc = _decode_tile(
                m_i, l_i, acc, loop_end, end, q, bt_row, k_cache_ptr, v_cache_ptr,
                k_scales_ptr, v_scales_ptr, kv_head, head_off, scale_log2, stride_cb, stride_cs,
                stride_vb, stride_vs, stride_vh, stride_sb, stride_sh, BLOCK_SIZE, HEAD_DIM,
                BLOCK_N, UPCAST, DOT_PRECISION, KV_FP8, V_DIM_MAJOR, True)

    has_tokens = l_i > 0  # False for an empty partition (and for padding rows never stored)
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
    if SPLIT:
        num_heads = tl.num_programs(0) * GROUP
        row = (seq * num_heads + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out,
                 mask=g_mask[:, None])
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)
    else:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32, log2 domain; -inf = empty
    out_ptr,  # [num_seqs, num_heads, head_dim]
    stride_os, stride_oh,
    num_heads,
    num_splits,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEADS: tl.constexpr = 1,  # query heads per program (`reduce_heads_per_program`)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (pdl_enabled)
):
    pdl_prologue(PDL)
    heads = tl.program_id(0) * HEADS + tl.arange(0, HEADS)
    seq = tl.program_id(1).to(tl.int64)
    h_mask = heads < num_heads
    out = _combine_partials(part_out_ptr, part_lse_ptr, (seq * num_heads + heads) * num_splits,
                            h_mask, num_splits, HEAD_DIM, SPLITS_PAD)
    tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh
             + tl.arange(0, HEAD_DIM)[None, :], out.to(out_ptr.dtype.element_ty),
             mask=h_mask[:, None])


def reduce_heads_per_program(num_seqs: int, num_heads: int, num_splits: int, head_dim: int,
                             num_sms: int) -> int:
    """Query heads per `_decode_reduce_kernel` program: the smallest power of two that
    brings the programs (num_seqs * cdiv(num_heads, heads)) to num_sms or fewer, while a
    program's partials (heads * next_pow2(num_splits) * head_dim fp32) stay within
    REDUCE_TILE_ELEMENTS; at most next_pow2(num_heads).

    Why: with PDL (`pdl_enabled`) the reduce's programs are launched while the split kernel
    still runs and wait there, so they start combining the moment it ends, but only as many
    as fit beside the split kernel's programs. One program per (sequence, query head) made
    896 at Qwen2-0.5B heads B64 (14 heads, 8 splits) over the FP8 cache, whose one-warp
    programs of 220 registers leave room for a few per SM: Nsight Compute timed that reduce
    at 4.6 us against 3.9 us for B16 L16384's 224 programs, and back to back the pair took
    28.0 against 25.0 us while the split kernels took 24.7 and 24.5
    (benchmarks/results/RUNS.md, "Runs of 2026-12-03 (17:05-17:45 UTC)").
    """
    heads = 1
    while (heads < next_pow2(num_heads) and num_seqs * triton.cdiv(num_heads, heads) > num_sms
           and 2 * heads * next_pow2(num_splits) * head_dim <= REDUCE_TILE_ELEMENTS):
        heads *= 2
    return heads


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int,
                      programs_per_sm: int = 4,
                      min_partition_tokens: int = MIN_PARTITION_TOKENS) -> int:
    """Split-K partitions per sequence for decode.

    Without splitting there are num_seqs * num_kv_heads programs, each streaming one KV head
    of one sequence. A memory-bound kernel needs several programs per SM to keep enough loads
    in flight. Measured on an H200 (132 SMs; bf16, 32/8 heads x 128, block 16; about two
    programs fit per SM by shared memory): B8 L32768 (64 programs) ran at 1.2 TB/s unsplit,
    3.8 with 4 splits, 4.2 with 8 and 16, but 3.0 with 9 (576 programs: a third, nearly empty
    wave); B64 L4096 (512 programs) is fastest unsplit (4.27 TB/s; 2 splits 4.17).

    So: no split from 3 programs per SM up; below that, the power of two at or under
    cdiv(programs_per_sm * num_sms, programs) (powers of two keep the program count a clean
    multiple of typical batch shapes, avoiding a ragged last wave), with each partition at
    least min_partition_tokens long and at most MAX_SPLITS partitions. programs_per_sm is 4
    for `_decode_kernel`'s 4-warp programs and 8 for the FP8 cache's one-warp warp-tile
    programs (4 for a 16-bit cache's); min_partition_tokens MIN_PARTITION_TOKENS (256) for
    `_decode_kernel`, 64 (two 32-token tiles) for the FP8 cache's warp tiles, 32 for a 16-bit
    cache's (`_decode_launch_config`, measured there).
    The engine's captured decode passes the block table's width as max_context, so at batch
    1 an FP8 cache's table of 4,096 tokens gets 64 partitions whatever the real lengths; the
    ones past a sequence's end read nothing.
    """
    programs = num_seqs * num_kv_heads
    if programs >= 3 * num_sms:
        return 1
    by_occupancy = triton.cdiv(programs_per_sm * num_sms, programs)
    by_length = max(1, max_context // min_partition_tokens)
    splits = max(1, min(by_occupancy, by_length, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)  # round down to a power of two


def _decode_launch_config(head_dim: int, kv_bytes: int = 2, warp_tiles: bool = True) -> dict:
    """The default decode launch: BLOCK_N, num_warps, num_stages; over an FP8 cache
    (kv_bytes 1) at head_dim 64 or 128, and a 16-bit one (kv_bytes 2) at head_dim 64, where
    the warp-tile kernel can run (warp_tiles: no sliding window) that kernel
    (`attention_decode_warp_triton`) and its split-count settings ("programs_per_sm",
    "min_partition_tokens").

    bf16/fp16/fp32 caches (`_decode_kernel`): about 16 KB of K (and of V) per tile, at most
    128 tokens (64 at head_dim 128 in bf16, 128 at 64), 4 warps, 3 stages. Measured on an
    H200 (bf16, block 16): at head_dim 128, BLOCK_N 64 / 4 warps / 3 stages was within noise
    of the best of ten configs; at head_dim 64 BLOCK_N 128 beat 64 by 40%.

    FP8 caches, warp tiles: BLOCK_N 32 (two 16-token sub-tiles), one warp, 5 stages, and
    split-K aiming at 8 programs per SM (`choose_num_splits`' programs_per_sm).
    `benchmarks/decode_tune.py` on an H200 (triton 3.6; benchmarks/results/RUNS.md, "Runs of
    2026-12-03 (05:55-06:50 UTC)"): Llama-3-8B heads (32/8 x 128) B64 L4096 139.2 us (bf16
    cache 246.0; FP8 with `_decode_kernel` below, 205.9), B8 L8192 46.0 us with 16 splits
    (bf16 73.6, FP8 with `_decode_kernel` 66.2); Qwen2-0.5B heads (14/2 x 64) B64 L4096 26.8
    us with 8 splits (bf16 39.7, `_decode_kernel` 37.8). BLOCK_N 64 / 2 warps was within 2%
    at B64 L4096 and faster at Qwen2-0.5B B8 L8192 (11.2 against 12.9 us). Partitions down to
    64 tokens ("min_partition_tokens"): at batch 1, 16 partitions of 256 tokens per KV head
    left most SMs idle, 15.6 us at Llama-3-8B heads B1 L4096 against 8.7 with 64 partitions
    (bf16 11.8), Qwen2-0.5B heads 7.8 against 5.7 (bf16 5.9; benchmarks/results/RUNS.md, "Runs
    of 2026-12-03 (09:00-10:30 UTC)"). Other head sizes keep `_decode_kernel` (unmeasured).

    16-bit caches at head_dim 64, warp tiles: the same 32/1/5 tiles, split-K aiming at 4
    programs per SM with partitions down to 32 tokens (one tile). Measured on an H200 at
    Qwen2-0.5B heads (`decode_tune.py --kv-cache-dtype auto --warp-tiles 1`;
    benchmarks/results/RUNS.md, "Runs of 2026-12-03 (17:05-17:45 UTC)"): B64 L2048 22.1 us
    with 4 splits (3.04 TB/s; `_decode_kernel` 24.1), B64 L4096 38.2 (40.5), B16 L16384 37.4
    with 16 splits (41.6), B8 L4096 6.8 with 32 (8.4), B1 L512 4.1 with 16 (5.3), B1 L4096
    6.0 with 64 (5.9), B256 L640 24.9 unsplit (24.8). At head_dim 128 they were slower over
    bf16 (Llama-3-8B heads B64 L4096 326.5 against 250.4 us), so other head sizes keep
    `_decode_kernel`; so does an unsplit launch (`decode_launch_plan`: the engine's 256-row
    decode step of Qwen2-0.5B took 2.07 against 1.86 ms with them, 2026-12-03 17:40), and fp32
    caches (kv_bytes 4, unmeasured).

    FP8 caches, `_decode_kernel` (with a sliding window): it
    takes 255 registers per thread uncapped (Nsight Compute; bf16: 125), 2 programs per SM.
    At head_dim 128, BLOCK_N 128 / 4 warps / 5 stages, uncapped: at 5 stages Triton gives
    the loop two shared-memory buffers per K/V tile, so the next tile's copies stay in
    flight during the products (docs/design.md, "FP8 KV cache"); 203.2 against 211.8 us at
    3 stages. Below head_dim 128, capped at 128 registers (`maxnreg`, Triton's compile
    option) with 2 stages, 4 programs fit: Qwen2-0.5B heads B64 L4096 38.1 against 50.2 us
    uncapped (benchmarks/results/RUNS.md, "Runs of 2026-12-02 (08:30-09:00 UTC)" and "Runs of
    2026-12-02 (15:20-16:20 UTC)").
    """
    if kv_bytes == 1 and warp_tiles and head_dim in (64, 128):  # the head sizes measured
        return {"BLOCK_N": 32, "num_warps": 1, "num_stages": 5, "warp_tiles": 1,
                "programs_per_sm": 8, "min_partition_tokens": 64}
    if kv_bytes == 2 and warp_tiles and head_dim == 64:
        return {"BLOCK_N": 32, "num_warps": 1, "num_stages": 5, "warp_tiles": 1,
                "programs_per_sm": 4, "min_partition_tokens": 32}
    block_n = max(16, min(128, 16384 // (head_dim * kv_bytes)))
    if kv_bytes == 1 and head_dim == 128:
        return {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 5}
    if kv_bytes == 1 and head_dim < 128:
        return {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 2, "maxnreg": 128}
    return {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 3}


def _positive_int(value) -> bool:
    """An int >= 1 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def decode_launch_plan(num_seqs: int, num_kv_heads: int, head_dim: int, fp8: bool,
                       max_context: int, num_sms: int, num_splits: int | None = None,
                       config: dict | None = None, sliding_window: int | None = None,
                       kv_bytes: int | None = None) -> tuple[dict, int, int]:
    """What `paged_attention_decode_triton` launches, without launching: (launch config,
    1 for the warp-tile kernel or 0 for `_decode_kernel`, num_splits). max_context: the
    longest context in tokens (the window's length with a window); num_splits None: the
    heuristic's (`choose_num_splits`, over the programs the kernel has); kv_bytes: bytes per
    cache element, None for 1 with fp8 and 2 otherwise (a 4-byte fp32 cache gets the 16-bit
    launch without warp tiles: unmeasured on a GPU).

    Raises:
        ValueError: config's warp_tiles not 0 or 1, its programs_per_sm or
            min_partition_tokens not an int >= 1, its reduce_heads not a power of two >= 1,
            or num_splits < 1.
    """
    # the warp-tile kernel has no window (a given config runs warp tiles only where it names
    # them)
    warp_ok = not sliding_window and (config is None or bool(config.get("warp_tiles")))
    # 16-bit caches: warp tiles only where the launch would split (fewer than 3 programs
    # per SM unsplit); unsplit, at Qwen2-0.5B's 256 x 512/128, the engine's decode step took
    # 2.07 against 1.86 ms on the H200 with them (benchmarks/results/RUNS.md, "Runs of
    # 2026-12-03 (17:05-17:45 UTC)")
    few = num_seqs * num_kv_heads < 3 * num_sms
    default = _decode_launch_config(head_dim, 1 if fp8 else 2,
                                    warp_ok and (fp8 or ((kv_bytes or 2) <= 2 and few)))
    tuned = {**default, **(config or {})}
    n = tuned.get("warp_tiles", 0) if warp_ok else 0  # 1: the warp-tile kernel
    if n not in (0, 1) or isinstance(n, bool):
        raise ValueError(f"config warp_tiles={n!r}; give 1 for the warp-tile kernel (one KV "
                         "head per program) or 0 for _decode_kernel")
    for key in ("programs_per_sm", "min_partition_tokens"):
        if not _positive_int(tuned.get(key, 1)):
            raise ValueError(f"config {key}={tuned[key]!r} must be an int >= 1")
    heads = tuned.get("reduce_heads", 1)
    if not _positive_int(heads) or heads & (heads - 1):
        raise ValueError(f"config reduce_heads={heads!r} (query heads per split-K reduce "
                         "program) must be a power of two >= 1")
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs, num_kv_heads, max_context, num_sms,
            tuned.get("programs_per_sm", 4) if n else 4,
            tuned.get("min_partition_tokens", MIN_PARTITION_TOKENS) if n else
            MIN_PARTITION_TOKENS)
    if num_splits < 1:
        raise ValueError(f"num_splits={num_splits}; must be >= 1")
    return tuned, n, num_splits


def paged_attention_decode_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    config: dict | None = None,
    *,
    validate: bool = True,
    sliding_window: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: one query token per sequence over its `seq_lens[i]` cached tokens.

    Args:
        query: [num_seqs, num_heads, head_dim], the caches' dtype (any of fp16/bf16/fp32 over
            an FP8 cache), head_dim contiguous.
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], fp16/bf16/fp32,
            or float8_e4m3fn with k_scales and v_scales; v_cache may be a view of
            [num_blocks, num_kv_heads, head_dim, block_size] storage (`v_dim_major`).
        block_tables: [num_seqs, max_blocks_per_seq] int32.
        seq_lens: [num_seqs] int32, >= 1 (the current token included).
        scale: softmax scale, usually head_dim ** -0.5.
        num_splits: split-K partitions per sequence; None picks `choose_num_splits`, 1 = none.
        max_seq_len: bound on seq_lens for the heuristic; None uses the block table's width
            (no device sync, so the call can be captured in a CUDA graph).
        config: launch overrides for tuning ({"BLOCK_N", "num_warps", "num_stages"}, and
            optionally "maxnreg" (a register cap, 0 none), "warp_tiles" (1: the warp-tile
            kernel of `attention_decode_warp_triton`, 0: `_decode_kernel`; ignored with a
            sliding window, which only `_decode_kernel` has),
            "programs_per_sm" (the split heuristic's target for warp tiles) and
            "min_partition_tokens" (its shortest partition for warp tiles), "reduce_heads"
            (query heads per split-K reduce program, a power of two; default
            `reduce_heads_per_program`); keys left out come from `_decode_launch_config` (8
            and 64 over an FP8 cache at head_dim 64 or 128, 4 and 32 over a 16-bit cache at
            head_dim 64, else 4 and MIN_PARTITION_TOKENS).
            None: the default (`_decode_launch_config`: warp tiles where they can run over
            an FP8 cache at head_dim 64 or 128 and a 16-bit cache at head_dim 64); a given
            config runs `_decode_kernel` unless it names warp_tiles.
            `decode_launch_plan` says what a call launches.
        validate: check the arguments' contract (ValueError); the model's attention layers
            pass False for tensors they built (see `pagedrt.ops.fused_triton`).
        sliding_window: attend only to the last `sliding_window` tokens (>= 1); None = all.
            Blocks before the window are not read.
        k_scales, v_scales: an FP8 cache's scales, [num_blocks, num_kv_heads, block_size]
            float32 (`pagedrt.ops.fp8`); None for other caches.
    Returns:
        [num_seqs, num_heads, head_dim] in query's dtype.
    Raises:
        ValueError: a broken contract (with `validate`), num_splits < 1, or a config's
            warp_tiles other than 0 or 1.

    With num_splits > 1 the partitions are combined by a second kernel,
    `_decode_reduce_kernel`.
    """
    if validate:
        check_decode_args(query, k_cache, v_cache, block_tables, seq_lens, k_scales, v_scales)
        check_sliding_window(sliding_window)
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_size = k_cache.shape[1]
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    fp8 = is_fp8(k_cache.dtype)
    max_context = max_seq_len or block_tables.shape[1] * block_size
    if sliding_window is not None:  # the tokens a query reads
        max_context = min(max_context, sliding_window)
    tuned, warp_tiles, num_splits = decode_launch_plan(
        num_seqs, num_kv_heads, head_dim, fp8, max_context, device_sms(query), num_splits,
        config, sliding_window, k_cache.element_size())
    upcast = interpreting(query)
    split = num_splits > 1
    if split:
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32,
                               device=query.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32,
                               device=query.device)
    else:
        part_out = part_lse = out  # unused by the kernel
    if not fp8:
        k_scales = v_scales = part_lse  # unused by the kernel
    # smaller fallbacks for GPUs with less shared memory (see launch_first_fitting)
    configs = [tuned] if config else [
        tuned, {"BLOCK_N": max(16, tuned["BLOCK_N"] // 2), "num_warps": 4, "num_stages": 2},
        {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}]

    def launch(cfg: dict) -> None:
        # the arguments both decode kernels take
        pointers = (query, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse,
                    k_scales, v_scales)
        scalars = (scale * LOG2E,
                   query.stride(0), query.stride(1),
                   k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                   *v_cache.stride(),
                   k_scales.stride(0), k_scales.stride(1),
                   block_tables.stride(0),
                   out.stride(0), out.stride(1),
                   num_splits)
        common = dict(
            GROUP=group, GROUP_PAD=max(16, next_pow2(group)), BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim, SPLIT=split, UPCAST=upcast,
            DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32", KV_FP8=fp8,
            F16_MMA=fp8 and query.dtype != torch.float32, V_DIM_MAJOR=dim_major,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(pdl),
            **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),  # 0: no cap
        )
        grid = (num_kv_heads, num_splits, num_seqs)
        if cfg.get("warp_tiles") and warp_tiles:  # (not the fallbacks)
            sub, sub_n = warp_tile_shape(cfg["BLOCK_N"])  # attention_decode_warp_triton
            _decode_warp_kernel[grid](*pointers, *scalars, SUB=sub, SUB_N=sub_n, **common)
            return
        _decode_kernel[grid](
            *pointers, *scalars, BLOCK_N=cfg["BLOCK_N"], WINDOW=sliding_window or 0, **common)

    dim_major = v_dim_major(v_cache)
    pdl = pdl_enabled(query)
    key = ("decode", str(query.device), query.dtype, head_dim, group, bool(config), fp8,
           dim_major, warp_tiles)
    launch_first_fitting(key, configs, launch)
    if split:
        heads = (config or {}).get("reduce_heads") or reduce_heads_per_program(
            num_seqs, num_heads, num_splits, head_dim, device_sms(query))
        _decode_reduce_kernel[(triton.cdiv(num_heads, heads), num_seqs)](
            part_out, part_lse, out, out.stride(0), out.stride(1), num_heads, num_splits,
            HEAD_DIM=head_dim, SPLITS_PAD=next_pow2(num_splits), HEADS=heads, num_warps=4,
            **pdl_launch(pdl),
        )
    return out


__all__ = [
    "choose_num_splits",
    "copy_blocks_triton",
    "decode_launch_plan",
    "paged_attention_decode_naive_triton",
    "paged_attention_decode_triton",
    "paged_attention_extend_triton",
    "reduce_heads_per_program",
    "write_kv_triton",
]
