"""Decode attention with one token slice per warp ("warp tiles"): the FP8 cache's default
decode kernel, and a 16-bit cache's at head_dim 64 where the launch splits, a variant of
`attention_triton._decode_kernel` (docs/design.md, "FP8 KV cache"; launch:
`attention_triton._decode_launch_config` and `decode_launch_plan`).

Why: in `_decode_kernel` a tile's BLOCK_N tokens are spread over the program's warps, so
every tile's softmax max and sum, the largest V scale and the probabilities' change of layout
between the two products cross warps through shared memory, behind barriers (14 bar.sync per
tile in the PTX compiled for sm_90 at 128/4/5 over FP8). Nsight Compute on the H200 found the
FP8 kernel stalled on shared-memory reads (short scoreboard) with 2 warps per scheduler
(benchmarks/results/RUNS.md, "Runs of 2026-12-02 (19:20-20:15 UTC)"). Here a tile is SUB
sub-tiles of SUB_N tokens, and the products are batched over the sub-tiles (3-D `tl.dot`,
which Triton's MMA v2 lowering spreads over warps along the batch dimension): each warp keeps
its own running max, sum and output for its sub-tile's tokens, so the loop's reductions stay
inside a warp (shuffles) and the probabilities stay in registers. The SUB partial states are
merged once, after the loop (the same merge as the split-K combine: weights exp2(m_w - max m)).

    grid = (num_kv_heads, num_splits, num_seqs), as `_decode_kernel`
    tile (BLOCK_N = SUB * SUB_N tokens):  | sub 0 | sub 1 | ... | sub SUB-1 |
    state, a row per sub-tile: m [SUB, GROUP_PAD], l [SUB, GROUP_PAD],
                               acc [SUB, GROUP_PAD, HEAD_DIM]

(Two KV heads per program, reading a token's rows of both together, 128 bytes at head_dim 64
over FP8 where one head's row is half a line, were slower than one at every shape timed on the
H200 and removed on 2026-12-06: benchmarks/results/RUNS.md, "Runs of 2026-12-03 (09:00-10:30
UTC)". So were two KV heads whose 7 + 7 query rows shared one 16-row operand, block-diagonal
over both heads' 128 columns, one softmax for both: 5-39% slower on an H100 at every
Qwen2-0.5B shape over both caches, removed on 2026-12-07: docs/design.md, "Decode attention:
measured, not kept".)

The price is SUB copies of the output accumulator (fp32) and of the query operand. Same
arguments, masking, FP8 scaling (scores' and probabilities' columns), V layouts and split-K
partials as `_decode_kernel`; no sliding window (the launcher keeps a window on
`_decode_kernel`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedrt.ops.triton_utils import load_group_query, pdl_prologue, tile_load


@triton.jit
def _warp_tile(
    m_i, l_i, acc,  # [SUB, GROUP_PAD], [SUB, GROUP_PAD], [SUB, GROUP_PAD, HEAD_DIM] fp32
    tile_start, end, q3, bt_row, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr,
    kv_head, head_off, scale_log2, stride_cb, stride_cs, stride_vb, stride_vs, stride_vh,
    stride_sb, stride_sh,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, SUB: tl.constexpr, SUB_N: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
    V_DIM_MAJOR: tl.constexpr, MASKED: tl.constexpr,
):
    """One BLOCK_N = SUB * SUB_N token tile; returns the new state of each of its SUB
    sub-tiles. head_off: the KV head's offset in a K row."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tile_start + tl.arange(0, SUB)[:, None] * SUB_N + tl.arange(0, SUB_N)[None, :]
    n_mask = offs_n < end  # [SUB, SUB_N]
    block = tile_load(bt_row + offs_n // BLOCK_SIZE, n_mask, MASKED).to(tl.int64)
    slot = offs_n % BLOCK_SIZE
    k_ptrs = (k_cache_ptr + (block * stride_cb + slot * stride_cs + head_off)[:, :, None]
              + offs_d[None, None, :])
    k = tile_load(k_ptrs, n_mask[:, :, None], MASKED)
    if UPCAST:
        k = k.to(tl.float32)
    if KV_FP8:
        k = k.to(q3.dtype)
    s = tl.dot(q3, tl.permute(k, (0, 2, 1)), input_precision=DOT_PRECISION) * scale_log2
    if KV_FP8:
        scale_off = block * stride_sb + kv_head * stride_sh + slot
        s = s * tile_load(k_scales_ptr + scale_off, n_mask, MASKED)[:, None, :]
    if MASKED:
        s = tl.where(n_mask[:, None, :], s, float("-inf"))
    # online softmax per (sub-tile, row); a sub-tile past `end` in the last tile has seen no
    # key: take it relative to 0 (p and alpha 0), never -inf - -inf
    m_new = tl.maximum(m_i, tl.max(s, 2))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, :, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 2)
    if V_DIM_MAJOR:  # tokens contiguous: load [SUB, HEAD_DIM, SUB_N], use its transpose
        v_ptrs = (v_cache_ptr + (block * stride_vb + kv_head * stride_vh + slot)[:, None, :]
                  + offs_d[None, :, None] * BLOCK_SIZE)
        v = tl.permute(tile_load(v_ptrs, n_mask[:, None, :], MASKED), (0, 2, 1))
    else:
        v_ptrs = (v_cache_ptr + (block * stride_vb + slot * stride_vs + kv_head * stride_vh)[
            :, :, None] + offs_d[None, None, :])
        v = tile_load(v_ptrs, n_mask[:, :, None], MASKED)
    if UPCAST:
        v = v.to(tl.float32)
    if KV_FP8:
        v = v.to(q3.dtype)
        v_scale = tile_load(v_scales_ptr + scale_off, n_mask, MASKED)
        # p * v_scale / (the sub-tile's largest v_scale) stays in fp16's range (decode doc)
        v_max = tl.max(v_scale, 1)
        v_max = tl.where(v_max > 0, v_max, 1.0)
        p_v = (p * (v_scale / v_max[:, None])[:, None, :]).to(v.dtype)
        pv = tl.dot(p_v, v, input_precision=DOT_PRECISION) * v_max[:, None, None]
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    acc = acc * alpha[:, :, None] + pv
    return m_new, l_i, acc


@triton.jit
def _merge_store(
    m_i, l_i, acc, heads, g_mask, seq, split, num_splits, out_ptr, part_out_ptr,
    part_lse_ptr, stride_os, stride_oh, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr,
    GROUP: tl.constexpr,
):
    """Merge the sub-tiles' states ([SUB, GROUP_PAD], [SUB, GROUP_PAD], [SUB, GROUP_PAD,
    HEAD_DIM]; weights exp2(m_w - max m), so a sub-tile with m -inf weighs 0) and store the
    query rows `heads` [GROUP_PAD] (real where g_mask): the output, or with SPLIT the
    partition's output and log2-sum-exp."""
    offs_d = tl.arange(0, HEAD_DIM)
    m_max = tl.max(m_i, 0)  # [GROUP_PAD]
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp2(m_i - m_ref[None, :])  # [SUB, GROUP_PAD]
    l_sum = tl.sum(l_i * weight, 0)
    merged = tl.sum(acc * weight[:, :, None], 0)  # [GROUP_PAD, HEAD_DIM]
    has_tokens = l_sum > 0
    out = merged / tl.where(has_tokens, l_sum, 1.0)[:, None]
    if SPLIT:
        num_heads = tl.num_programs(0) * GROUP
        row = (seq * num_heads + heads) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out,
                 mask=g_mask[:, None])
        lse = tl.where(has_tokens, m_max + tl.log2(tl.where(has_tokens, l_sum, 1.0)),
                       float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)
    else:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit
def _decode_warp_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr,
    part_lse_ptr, k_scales_ptr, v_scales_ptr,  # as `_decode_kernel`
    scale_log2,
    stride_qs, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_sb, stride_sh,
    stride_bt,
    stride_os, stride_oh,
    num_splits,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SUB: tl.constexpr,  # sub-tiles per tile (one per warp when SUB == num_warps)
    SUB_N: tl.constexpr,  # tokens per sub-tile (>= 16, tl.dot's smallest)
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, F16_MMA: tl.constexpr, V_DIM_MAJOR: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    BLOCK_N: tl.constexpr = SUB * SUB_N
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    part_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * part_len
    end = tl.minimum(start + part_len, seq_len)

    q, heads, g_mask, scale_log2 = load_group_query(
        q_ptr, seq, kv_head, stride_qs, stride_qh, scale_log2, GROUP, GROUP_PAD, HEAD_DIM,
        UPCAST, F16_MMA)
    q3 = tl.broadcast_to(q[None, :, :], (SUB, GROUP_PAD, HEAD_DIM))

    m_i = tl.full([SUB, GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([SUB, GROUP_PAD], tl.float32)
    acc = tl.zeros([SUB, GROUP_PAD, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    head_off = kv_head * stride_ch
    # full tiles unmasked, then the partial one masked (`_decode_kernel`'s V_DIM_MAJOR note)
    loop_end = start + (end - start) // BLOCK_N * BLOCK_N
    for tile_start in range(start, loop_end, BLOCK_N):
        m_i, l_i, acc = _warp_tile(
            m_i, l_i, acc, tile_start, end, q3, bt_row, k_cache_ptr, v_cache_ptr, k_scales_ptr,
            v_scales_ptr, kv_head, head_off, scale_log2, stride_cb, stride_cs, stride_vb,
            stride_vs, stride_vh, stride_sb, stride_sh, BLOCK_SIZE, HEAD_DIM, SUB, SUB_N,
            UPCAST, DOT_PRECISION, KV_FP8, V_DIM_MAJOR, False)
    if loop_end < end:
        m_i, l_i, acc = _warp_tile(
            m_i, l_i, acc, loop_end, end, q3, bt_row, k_cache_ptr, v_cache_ptr, k_scales_ptr,
            v_scales_ptr, kv_head, head_off, scale_log2, stride_cb, stride_cs, stride_vb,
            stride_vs, stride_vh, stride_sb, stride_sh, BLOCK_SIZE, HEAD_DIM, SUB, SUB_N,
            UPCAST, DOT_PRECISION, KV_FP8, V_DIM_MAJOR, True)

    _merge_store(m_i, l_i, acc, heads, g_mask, seq, split, num_splits, out_ptr, part_out_ptr,
                 part_lse_ptr, stride_os, stride_oh, HEAD_DIM, SPLIT, GROUP)


def warp_tile_shape(block_n: int) -> tuple[int, int]:
    """(SUB, SUB_N) for a tile of block_n tokens: sub-tiles of 16 tokens (tl.dot's smallest
    dimension), so a 64-token tile is 4 sub-tiles, one per warp at num_warps 4.

    Raises:
        ValueError: block_n not 16 times a power of two, at least 32 (tl.arange's lengths
            are powers of two).
    """
    sub = block_n // 16
    if block_n < 32 or block_n % 16 or sub & (sub - 1):
        raise ValueError(f"BLOCK_N={block_n} for warp tiles; give 16 times a power of two, "
                         f">= 32 (32, 64, 128, ...)")
    return block_n // 16, 16


__all__ = ["warp_tile_shape"]
