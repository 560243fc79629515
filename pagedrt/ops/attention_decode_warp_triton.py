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
UTC)".)

Packed KV heads (PACK > 1, launch config "kv_heads_per_program"; opt-in): a program reads
PACK consecutive KV heads and stacks their GROUP query rows into one operand of GROUP_PAD >=
GROUP * PACK rows, block-diagonal over PACK * HEAD_DIM columns (row r holds its query in the
columns of its own head, r // GROUP, and zeros in the others'). A token's K rows of the PACK
heads, side by side, are one row of PACK * HEAD_DIM, so `q K^T` gives every row its own
head's scores, and `P V` gives it its head's output in its own columns (the other columns
are dropped after the loop). The MMA count is that of PACK one-head programs (the zero blocks
are multiplied), but the softmax runs once over GROUP_PAD rows instead of PACK times, and at
Qwen2-0.5B's GQA 7 the 16-row operand carries 14 real rows instead of 7. FP8 scales are taken
per row from its head (`_row_scales`).

The price is SUB copies of the output accumulator (fp32) and of the query operand. Same
arguments, masking, FP8 scaling (scores' and probabilities' columns), V layouts and split-K
partials as `_decode_kernel`; no sliding window (the launcher keeps a window on
`_decode_kernel`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedrt.ops.triton_utils import load_group_query, pdl_prologue, query_operand, tile_load


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
def _row_scales(scales_ptr, block, slot, n_mask, kv_head0, pack_of_row, stride_sb, stride_sh,
                PACK: tl.constexpr, MASKED: tl.constexpr):
    """An FP8 tile's scales as each query row needs them, its own KV head's:
    [SUB, GROUP_PAD, SUB_N] fp32 from PACK loads of [SUB, SUB_N] (row r reads KV head
    kv_head0 + pack_of_row[r])."""
    off = block * stride_sb + slot
    s0 = tile_load(scales_ptr + off + kv_head0 * stride_sh, n_mask, MASKED)
    rows = tl.where(pack_of_row[None, :, None] == 0, s0[:, None, :], 0.0)
    for h in tl.static_range(1, PACK):
        s_h = tile_load(scales_ptr + off + (kv_head0 + h) * stride_sh, n_mask, MASKED)
        rows = tl.where(pack_of_row[None, :, None] == h, s_h[:, None, :], rows)
    return rows


@triton.jit
def _packed_warp_tile(
    m_i, l_i, acc,  # [SUB, GROUP_PAD], [SUB, GROUP_PAD], [SUB, GROUP_PAD, PACK * HEAD_DIM]
    tile_start, end, q3, pack_of_row, bt_row, k_cache_ptr, v_cache_ptr, k_scales_ptr,
    v_scales_ptr, kv_head0, scale_log2, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs,
    stride_vh, stride_sb, stride_sh,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, PACK: tl.constexpr, SUB: tl.constexpr,
    SUB_N: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, V_DIM_MAJOR: tl.constexpr, MASKED: tl.constexpr,
):
    """`_warp_tile` over PACK KV heads at once (module doc, "Packed KV heads"): a token's
    rows of the PACK heads side by side as one row of PACK * HEAD_DIM, against the packed
    block-diagonal query; the row scales (FP8) per query row's head."""
    offs_c = tl.arange(0, PACK * HEAD_DIM)
    c_head = offs_c // HEAD_DIM  # the packed head of each column
    c_dim = offs_c % HEAD_DIM
    offs_n = tile_start + tl.arange(0, SUB)[:, None] * SUB_N + tl.arange(0, SUB_N)[None, :]
    n_mask = offs_n < end  # [SUB, SUB_N]
    block = tile_load(bt_row + offs_n // BLOCK_SIZE, n_mask, MASKED).to(tl.int64)
    slot = offs_n % BLOCK_SIZE
    k_ptrs = (k_cache_ptr + (block * stride_cb + slot * stride_cs + kv_head0 * stride_ch)[
        :, :, None] + (c_head * stride_ch + c_dim)[None, None, :])
    k = tile_load(k_ptrs, n_mask[:, :, None], MASKED)  # [SUB, SUB_N, PACK * HEAD_DIM]
    if UPCAST:
        k = k.to(tl.float32)
    if KV_FP8:
        k = k.to(q3.dtype)
    s = tl.dot(q3, tl.permute(k, (0, 2, 1)), input_precision=DOT_PRECISION) * scale_log2
    if KV_FP8:
        s = s * _row_scales(k_scales_ptr, block, slot, n_mask, kv_head0, pack_of_row,
                            stride_sb, stride_sh, PACK, MASKED)
    if MASKED:
        s = tl.where(n_mask[:, None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 2))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, :, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 2)
    if V_DIM_MAJOR:
        v_ptrs = (v_cache_ptr + (block * stride_vb + kv_head0 * stride_vh + slot)[:, None, :]
                  + (c_head * stride_vh + c_dim * BLOCK_SIZE)[None, :, None])
        v = tl.permute(tile_load(v_ptrs, n_mask[:, None, :], MASKED), (0, 2, 1))
    else:
        v_ptrs = (v_cache_ptr + (block * stride_vb + slot * stride_vs + kv_head0 * stride_vh)[
            :, :, None] + (c_head * stride_vh + c_dim)[None, None, :])
        v = tile_load(v_ptrs, n_mask[:, :, None], MASKED)
    if UPCAST:
        v = v.to(tl.float32)
    if KV_FP8:
        v = v.to(q3.dtype)
        v_scale = _row_scales(v_scales_ptr, block, slot, n_mask, kv_head0, pack_of_row,
                              stride_sb, stride_sh, PACK, MASKED)
        v_max = tl.max(v_scale, 2)  # [SUB, GROUP_PAD]
        v_max = tl.where(v_max > 0, v_max, 1.0)
        p_v = (p * (v_scale / v_max[:, :, None])).to(v.dtype)
        pv = tl.dot(p_v, v, input_precision=DOT_PRECISION) * v_max[:, :, None]
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
    PACK: tl.constexpr = 1,  # KV heads per program, their query rows packed (module doc)
):
    pdl_prologue(PDL)
    if PACK > 1:
        _packed_program(
            q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
            part_out_ptr, part_lse_ptr, k_scales_ptr, v_scales_ptr, scale_log2, stride_qs,
            stride_qh, stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh,
            stride_sb, stride_sh, stride_bt, stride_os, stride_oh, num_splits, GROUP,
            GROUP_PAD, BLOCK_SIZE, HEAD_DIM, SUB, SUB_N, SPLIT, UPCAST, DOT_PRECISION, KV_FP8,
            F16_MMA, V_DIM_MAJOR, PACK)
    else:
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


@triton.jit
def _packed_program(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr,
    part_lse_ptr, k_scales_ptr, v_scales_ptr, scale_log2, stride_qs, stride_qh, stride_cb,
    stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, stride_sb, stride_sh, stride_bt,
    stride_os, stride_oh, num_splits,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, SUB: tl.constexpr, SUB_N: tl.constexpr, SPLIT: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
    F16_MMA: tl.constexpr, V_DIM_MAJOR: tl.constexpr, PACK: tl.constexpr,
):
    """`_decode_warp_kernel`'s program over PACK KV heads (kv_head0 = program_id(0) * PACK
    and the next PACK - 1), their GROUP * PACK query rows packed into one GROUP_PAD-row
    operand (module doc, "Packed KV heads")."""
    BLOCK_N: tl.constexpr = SUB * SUB_N
    kv_head0 = tl.program_id(0) * PACK
    split = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    part_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * part_len
    end = tl.minimum(start + part_len, seq_len)

    # the block-diagonal query: row r (query head kv_head0 * GROUP + r) holds its vector in
    # the columns of its own KV head, pack_of_row[r], and zeros in the others'
    offs_g = tl.arange(0, GROUP_PAD)
    offs_c = tl.arange(0, PACK * HEAD_DIM)
    pack_of_row = tl.minimum(offs_g // GROUP, PACK - 1)
    heads = kv_head0 * GROUP + offs_g
    g_mask = offs_g < GROUP * PACK
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh
                + (offs_c % HEAD_DIM)[None, :],
                mask=g_mask[:, None] & ((offs_c // HEAD_DIM)[None, :] == pack_of_row[:, None]),
                other=0.0)
    q, scale_log2 = query_operand(q, scale_log2, UPCAST, F16_MMA)
    q3 = tl.broadcast_to(q[None, :, :], (SUB, GROUP_PAD, PACK * HEAD_DIM))

    m_i = tl.full([SUB, GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([SUB, GROUP_PAD], tl.float32)
    acc = tl.zeros([SUB, GROUP_PAD, PACK * HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    loop_end = start + (end - start) // BLOCK_N * BLOCK_N
    for tile_start in range(start, loop_end, BLOCK_N):
        m_i, l_i, acc = _packed_warp_tile(
            m_i, l_i, acc, tile_start, end, q3, pack_of_row, bt_row, k_cache_ptr, v_cache_ptr,
            k_scales_ptr, v_scales_ptr, kv_head0, scale_log2, stride_cb, stride_cs, stride_ch,
            stride_vb, stride_vs, stride_vh, stride_sb, stride_sh, BLOCK_SIZE, HEAD_DIM, PACK,
            SUB, SUB_N, UPCAST, DOT_PRECISION, KV_FP8, V_DIM_MAJOR, False)
    if loop_end < end:
        m_i, l_i, acc = _packed_warp_tile(
            m_i, l_i, acc, loop_end, end, q3, pack_of_row, bt_row, k_cache_ptr, v_cache_ptr,
            k_scales_ptr, v_scales_ptr, kv_head0, scale_log2, stride_cb, stride_cs, stride_ch,
            stride_vb, stride_vs, stride_vh, stride_sb, stride_sh, BLOCK_SIZE, HEAD_DIM, PACK,
            SUB, SUB_N, UPCAST, DOT_PRECISION, KV_FP8, V_DIM_MAJOR, True)

    # each row keeps its own head's columns: [SUB, GROUP_PAD, PACK, HEAD_DIM] -> HEAD_DIM
    acc4 = tl.reshape(acc, (SUB, GROUP_PAD, PACK, HEAD_DIM))
    own = tl.arange(0, PACK)[None, None, :, None] == pack_of_row[None, :, None, None]
    acc_own = tl.sum(tl.where(own, acc4, 0.0), 2)
    _merge_store(m_i, l_i, acc_own, heads, g_mask, seq, split, num_splits, out_ptr,
                 part_out_ptr, part_lse_ptr, stride_os, stride_oh, HEAD_DIM, SPLIT,
                 GROUP * PACK)


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
