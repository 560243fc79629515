"""Triton paged-attention extend kernel: causal attention of packed query chunks over their
cached prefixes (prefill, chunked prefill, prefix-cache hits; decode is the q_len == 1 case).

    grid = (num_kv_heads, cdiv(max_query_len, TOKENS_PER_TILE), num_seqs)

A program takes TOKENS_PER_TILE = BLOCK_M // GROUP query tokens of one sequence times the
GROUP query heads of one KV head, as BLOCK_M rows (row = token * GROUP + head_in_group), so
every K/V tile loaded serves the whole GQA group. Rows past the tile's tokens are padding:
they are clamped to a real token's position (so no row is ever fully masked and the online
softmax never sees max = -inf) and are not stored.

The query tokens of sequence i are the last q_len of its seq_len cached tokens; token j of
the chunk sits at position p_j = seq_len - q_len + j and sees keys 0 .. p_j:

    keys:   0 ...................................... seq_len-1
    tile:         [p_first ........ p_last]  (this program's tokens)
    loop 1: keys [0, p_first + 1) rounded down to BLOCK_N: no causal mask needed
    loop 2: the rest up to p_last: masked with key <= p_row

With a sliding window W (WINDOW > 0, a constexpr; 0 compiles the kernel above unchanged) the
row at p sees keys p - W + 1 .. p, and the tile's keys split into three ranges:

    keys:   lo = max(p_first - W + 1, 0) ............................. p_last
            [ lower band: masked ][ seen by every row: no mask ][ upper band: masked ]
                                  ^ max(p_last - W + 1, lo), whole BLOCK_N tiles up to p_first

Keys before lo, and the blocks holding only such keys, are never read (the KV manager may
have given those blocks to another sequence). A row can see nothing in a lower-band tile, so
that path keeps its running max at -inf safely (exp2 of -inf - 0 = 0, never -inf - -inf).

An FP8 cache (KV_FP8) is read as in the decode kernel (`attention_triton.py`): fp8 tiles
converted in registers (to fp16 under a 16-bit query, F16_MMA), each key's scale applied to its
score column and each value's, over the tile's largest, to its probability column.

That conversion made prefill over an FP8 cache slower than over bf16 (1.32x per step on the
H200, docs/design.md, "FP8 KV cache"): Hopper's warpgroup MMA takes its K and V operands from
shared memory, so each fp8 tile makes a round trip through registers to be converted. So the
chunk's own keys are not read back from the cache: with FRESH_CHUNK_KV (an FP8 cache, no
sliding window, the caller passing the step's `key` and `value`) a program first walks the
chunk's keys j = 0 .. its last token from those [num_tokens, num_kv_heads, head_dim] rows in
the query's dtype (unmasked tiles up to its first token, then the diagonal masked with
j <= tok), exactly as over a bf16 cache, and then the cached prefix [0, context) from the
cache (unmasked tiles, the last one masked at context). A whole prompt prefilled in one chunk
thus reads no fp8 at all. The model's writers leave those rows holding what the cache holds
(`write_kv_triton`'s round_rows: the fp8 values times their scales, rounded to the model's
dtype), so a chunk sees its own keys as every later step will, and a request's tokens do not
depend on how its prompt was chunked, cached or recomputed (beyond the model dtype's
rounding of those rows). With
FP8_MMA (opt-in: `fp8_prefill_mma_requested`; V dim-major, so that both of P @ V's operands
are contiguous along the tokens it sums over, as FP8 MMA needs) nothing is converted: each
query row is divided by its largest |value| / 448 and rounded to e4m3 (its scale multiplies
its scores), the probabilities times the value scales are scaled to e4m3's 448 and rounded
(`fp8_scaled_pv`), and both products run on FP8 tensor cores from the tiles as loaded
(`benchmarks/diagnostics/extend_ptx.py` counts the instructions). The price is the rounding
of the query and the probabilities to e4m3's 3 mantissa bits.

One-token chunks (NARROW_M > 0: no window, not FP8_MMA; on unless
PAGEDRT_EXTEND_NARROW_DECODE=0). The scheduler batches decode rows with prompts, and each such
row used to run as a whole BLOCK_M-row tile with GROUP rows in use, 256 / 4 = 64 times the
products it needs: 96 rows of 4,200 tokens added 1.19 ms to a bf16 launch (2.67 ms over FP8)
where the decode kernel takes 0.44 ms for them (H200, docs/design.md, "FP8 KV cache"). Now the
program (kv_head, 0, seq) of a one-token chunk runs `_extend_decode_row`: its GROUP query heads
on a NARROW_M = max(16, GROUP rounded up to a power of two) row tile over keys 0 .. seq_len - 1
(its own from the step's rows under FRESH_CHUNK_KV), and the other q_tile programs of that
sequence return at once, as before. Compiled for sm_90, the narrow path adds no spills at the
engine's configs (bf16 at BLOCK_M 256: 120 bytes of stack frame against 136 without it; FP8
at 128: 0 against 8; `benchmarks/diagnostics/extend_ptx.py`). Not yet timed on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.env_flags import env_flag
from pagedrt.ops.fp8 import is_fp8
from pagedrt.ops.triton_utils import (
    LOG2E,
    check_index,
    check_paged_args,
    check_sliding_window,
    env_config,
    interpreting,
    launch_first_fitting,
    next_pow2,
    v_dim_major,
)


def fp8_prefill_mma_requested() -> bool:
    """PAGEDRT_FP8_PREFILL_MMA=1: the extend kernel over an FP8 cache with V dim-major runs its
    products in FP8 (FP8_MMA, module doc). Off by default: not yet timed or measured for
    accuracy on a GPU. Read at every launch."""
    return env_flag("PAGEDRT_FP8_PREFILL_MMA")


def narrow_decode_rows_requested() -> bool:
    """PAGEDRT_EXTEND_NARROW_DECODE=0 turns off NARROW_M (module doc: one-token chunks on a
    narrow tile); on ("1") by default. Read at every launch."""
    return env_flag("PAGEDRT_EXTEND_NARROW_DECODE")


def extend_config_override() -> dict | None:
    """PAGEDRT_EXTEND_CONFIG="BLOCK_M,BLOCK_N,num_warps,num_stages": the launch config the
    extend kernel tries first over a 16-bit cache, before the defaults
    (`_extend_launch_configs`), a tuning override for A/B runs of the configs
    `benchmarks/diagnostics/prefill_parts.py` times; unset: None
    (docs/design.md, "Prefill by parts"). Read at every launch.

    Raises:
        ValueError: not four comma-separated positive ints (`env_config`).
    """
    return env_config("PAGEDRT_EXTEND_CONFIG", ("BLOCK_M", "BLOCK_N", "num_warps",
                                                "num_stages"), "64,64,4,2")


@triton.jit
def online_softmax_step(m_i, l_i, s, GUARD_EMPTY: tl.constexpr = False):
    """One tile of the single-pass online softmax (Milkman & Gimelshein 2018; FlashAttention,
    Dao et al. 2022), in the log2 domain, shared by the extend and decode kernels.

    m_i, l_i: [M] fp32, the rows' running max and sum of exp2(score - max); s: [M, N] fp32,
    the tile's scores, already times softmax scale * log2(e), -inf where masked. Returns
    (m_new, p, alpha, l_new): m_new = max(m_i, max of s) [M], p = exp2(s - m_new) [M, N],
    alpha = exp2(m_i - m_new) [M] (the factor of the running sum and output), l_new = l_i *
    alpha + sum of p [M]. GUARD_EMPTY (a constexpr) is for rows that may have seen no key yet
    (all -inf so far): their m_new stays -inf while p and alpha are taken relative to 0 instead
    (both then 0), never -inf - -inf (NaN)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = m_new  # what scores are taken relative to
    if GUARD_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    return m_new, p, alpha, l_i * alpha + tl.sum(p, 1)


@triton.jit
def fp8_scaled_pv(p, v, v_scale, DOT_PRECISION: tl.constexpr, FP8_P: tl.constexpr = False):
    """p @ (v * v_scale) for one tile of an FP8 cache, as (p * v_scale) @ v: p [M, BLOCK_N]
    fp32, v [BLOCK_N, HEAD_DIM] the converted fp8 values, v_scale [BLOCK_N] their per-token
    scales, divided by the tile's largest (which multiplies the product instead) so that
    p * v_scale stays in v's 16-bit range (decode kernel doc). With FP8_P (v is e4m3, or its
    fp32 upcast in the interpreter), p * v_scale / v_max is scaled by 448 and rounded to e4m3
    too, so that the product runs on FP8 tensor cores. Returns [M, HEAD_DIM] fp32."""
    v_max = tl.max(v_scale, 0)
    v_max = tl.where(v_max > 0, v_max, 1.0)
    if FP8_P:  # v holds e4m3 values: p * v_scale / v_max in [0, 1], scaled to e4m3's 448
        p_v = (p * (v_scale * (448.0 / v_max))[None, :]).to(tl.float8e4nv).to(v.dtype)
        return tl.dot(p_v, v, input_precision=DOT_PRECISION) * (v_max / 448.0)
    p_v = (p * (v_scale / v_max)[None, :]).to(v.dtype)
    return tl.dot(p_v, v, input_precision=DOT_PRECISION) * v_max


@triton.jit
def _extend_tiles(
    acc, l_i, m_i, q, pos,
    k_cache_ptr, v_cache_ptr, bt_row, head_off,
    stride_cb, stride_cs, scale_log2,
    lo, hi,
    offs_d,
    k_scales_ptr, v_scales_ptr, scale_head_off, stride_sb,  # used when KV_FP8
    v_head_off, stride_vb, stride_vs, stride_vd,  # V's own strides (block, slot, dim); unit
    # ones and stride_vd (1, or BLOCK_SIZE dim-major) are literals (see the decode kernel)
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, WINDOW: tl.constexpr,
    KV_FP8: tl.constexpr, V_DIM_MAJOR: tl.constexpr, FP8_MMA: tl.constexpr = False,
):
    """Online-softmax update over keys [lo, hi); with CAUSAL_MASK, key <= pos[row] and < hi,
    and with WINDOW > 0 also key > pos[row] - WINDOW. scale_log2: a scalar, or [BLOCK_M, 1]
    (FP8_MMA: each row's query scale folded in)."""
    for tile_start in range(lo, hi, BLOCK_N):
        offs_n = tile_start + tl.arange(0, BLOCK_N)
        if CAUSAL_MASK:
            n_mask = offs_n < hi
            block = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            kv_off = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + head_off
            k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=n_mask[:, None],
                        other=0.0)
            if V_DIM_MAJOR:  # tokens contiguous: load [HEAD_DIM, BLOCK_N], use its transpose
                v_off = block * stride_vb + v_head_off + offs_n % BLOCK_SIZE
                v = tl.trans(tl.load(v_cache_ptr + v_off[None, :] + offs_d[:, None] * BLOCK_SIZE,
                                     mask=n_mask[None, :], other=0.0))
            else:
                v_off = block * stride_vb + (offs_n % BLOCK_SIZE) * stride_vs + v_head_off
                v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :],
                            mask=n_mask[:, None], other=0.0)
        else:
            block = tl.load(bt_row + offs_n // BLOCK_SIZE).to(tl.int64)
            kv_off = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + head_off
            k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :])
            if V_DIM_MAJOR:
                v_off = block * stride_vb + v_head_off + offs_n % BLOCK_SIZE
                v = tl.trans(tl.load(v_cache_ptr + v_off[None, :] + offs_d[:, None] * BLOCK_SIZE))
            else:
                v_off = block * stride_vb + (offs_n % BLOCK_SIZE) * stride_vs + v_head_off
                v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if KV_FP8:
            if not FP8_MMA:  # (FP8_MMA: the products take the e4m3 tiles as they are)
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            scale_off = block * stride_sb + scale_head_off + offs_n % BLOCK_SIZE
            if CAUSAL_MASK:
                k_scale = tl.load(k_scales_ptr + scale_off, mask=n_mask, other=0.0)
                v_scale = tl.load(v_scales_ptr + scale_off, mask=n_mask, other=0.0)
            else:
                k_scale = tl.load(k_scales_ptr + scale_off)
                v_scale = tl.load(v_scales_ptr + scale_off)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        if KV_FP8:
            s = s * k_scale[None, :]
        if CAUSAL_MASK:
            visible = (offs_n[None, :] <= pos[:, None]) & (offs_n < hi)[None, :]
            if WINDOW > 0:
                visible = visible & (offs_n[None, :] > pos[:, None] - WINDOW)
            s = tl.where(visible, s, float("-inf"))
        # (under a window a row may have seen no key yet: keep -inf - -inf out)
        m_new, p, alpha, l_i = online_softmax_step(m_i, l_i, s, WINDOW > 0)
        if KV_FP8:
            pv = fp8_scaled_pv(p, v, v_scale, DOT_PRECISION, FP8_MMA)
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _extend_chunk_tiles(
    acc, l_i, m_i, q, tok,
    k_rows_ptr, v_rows_ptr,  # the sequence's first chunk token's key / value row, this head
    stride_knt, stride_vnt,  # row strides of key and value (head_dim contiguous)
    scale_log2, lo, hi, offs_d,
    BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online-softmax update over the chunk's own keys j in [lo, hi) (chunk indices), read
    from the step's key and value rows in the query's dtype; with CAUSAL_MASK, j <= tok[row]
    and j < hi (FRESH_CHUNK_KV, module doc)."""
    for tile_start in range(lo, hi, BLOCK_N):
        offs_n = tile_start + tl.arange(0, BLOCK_N)
        k_ptrs = k_rows_ptr + offs_n.to(tl.int64)[:, None] * stride_knt + offs_d[None, :]
        v_ptrs = v_rows_ptr + offs_n.to(tl.int64)[:, None] * stride_vnt + offs_d[None, :]
        if CAUSAL_MASK:
            n_mask = offs_n < hi
            k = tl.load(k_ptrs, mask=n_mask[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        if CAUSAL_MASK:
            visible = (offs_n[None, :] <= tok[:, None]) & (offs_n < hi)[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new, p, alpha, l_i = online_softmax_step(m_i, l_i, s)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _products_query(q, scale_log2, FP8_MMA: tl.constexpr, F16_MMA: tl.constexpr,
                    UPCAST: tl.constexpr):
    """The query as the cache-tile products take it, and the factor of their scores: with
    FP8_MMA each row over its largest |value| / 448 in e4m3 (its scale into the factor, [M, 1]),
    with F16_MMA in fp16 over 64 (exact), else unchanged. q: [M, HEAD_DIM]."""
    if FP8_MMA:
        q_amax = tl.max(tl.abs(q.to(tl.float32)), 1)
        q_scale = tl.where(q_amax > 0, q_amax / 448.0, 1.0)
        q_mma = (q.to(tl.float32) / q_scale[:, None]).to(tl.float8e4nv)
        if UPCAST:
            q_mma = q_mma.to(tl.float32)
        score_scale = (scale_log2 * q_scale)[:, None]
    elif F16_MMA:
        q_mma = (q.to(tl.float32) * 0.015625).to(tl.float16)  # / 64, exact
        score_scale = scale_log2 * 64.0
    else:
        q_mma = q
        score_scale = scale_log2
    return q_mma, score_scale


@triton.jit
def _extend_decode_row(
    q_ptr, out_ptr, q_row, kv_head, seq_len, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    k_cache_ptr, v_cache_ptr, bt_row, head_off, stride_cb, stride_cs,
    k_scales_ptr, v_scales_ptr, scale_head_off, stride_sb,
    v_head_off, stride_vb, stride_vs, stride_vd,
    k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh,
    GROUP: tl.constexpr, NARROW_M: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr, F16_MMA: tl.constexpr,
    V_DIM_MAJOR: tl.constexpr, FRESH_CHUNK_KV: tl.constexpr,
):
    """A one-token chunk (a decode row batched with prompts) on a NARROW_M-row tile: the GROUP
    query heads of its token at position seq_len - 1 over keys 0 .. seq_len - 1 (its own key
    from k_new / v_new under FRESH_CHUNK_KV), stored to out (module doc)."""
    offs_g = tl.arange(0, NARROW_M)
    offs_d = tl.arange(0, HEAD_DIM)
    g_mask = offs_g < GROUP
    head = kv_head * GROUP + offs_g
    q_row = q_row.to(tl.int64)
    q = tl.load(q_ptr + q_row * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([NARROW_M], float("-inf"), tl.float32)
    l_i = tl.zeros([NARROW_M], tl.float32)
    acc = tl.zeros([NARROW_M, HEAD_DIM], tl.float32)
    pos = tl.zeros([NARROW_M], tl.int32) + (seq_len - 1)  # every row is the one token
    cache_end = seq_len
    if FRESH_CHUNK_KV:  # its own key and value from the step's rows
        cache_end = seq_len - 1
        acc, l_i, m_i = _extend_chunk_tiles(
            acc, l_i, m_i, q, tl.zeros([NARROW_M], tl.int32),
            k_new_ptr + q_row * stride_knt + kv_head * stride_knh,
            v_new_ptr + q_row * stride_vnt + kv_head * stride_vnh, stride_knt, stride_vnt,
            scale_log2, 0, 1, offs_d, BLOCK_N, True, UPCAST, DOT_PRECISION)
    q_mma, score_scale = _products_query(q, scale_log2, False, F16_MMA, UPCAST)
    unmasked = (cache_end // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _extend_tiles(
        acc, l_i, m_i, q_mma, pos, k_cache_ptr, v_cache_ptr, bt_row, head_off,
        stride_cb, stride_cs, score_scale, 0, unmasked, offs_d,
        k_scales_ptr, v_scales_ptr, scale_head_off, stride_sb,
        v_head_off, stride_vb, stride_vs, stride_vd,
        BLOCK_SIZE, BLOCK_N, False, UPCAST, DOT_PRECISION, 0, KV_FP8, V_DIM_MAJOR, False)
    acc, l_i, m_i = _extend_tiles(
        acc, l_i, m_i, q_mma, pos, k_cache_ptr, v_cache_ptr, bt_row, head_off,
        stride_cb, stride_cs, score_scale, unmasked, cache_end, offs_d,
        k_scales_ptr, v_scales_ptr, scale_head_off, stride_sb,
        v_head_off, stride_vb, stride_vs, stride_vd,
        BLOCK_SIZE, BLOCK_N, True, UPCAST, DOT_PRECISION, 0, KV_FP8, V_DIM_MAJOR, False)
    out = acc / l_i[:, None]  # l_i >= 1: the token sees its own key
    tl.store(out_ptr + q_row * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit(do_not_specialize=["stride_bt"])  # the table's width changes from step to step
def _extend_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32
    out_ptr,  # [num_tokens, num_heads, head_dim]
    k_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; read when KV_FP8
    v_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; read when KV_FP8
    k_new_ptr,  # [num_tokens, num_kv_heads, head_dim], query's dtype; read when FRESH_CHUNK_KV
    v_new_ptr,  # [num_tokens, num_kv_heads, head_dim], query's dtype; read when FRESH_CHUNK_KV
    scale_log2,  # softmax scale * log2(e)
    stride_qt, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_vb, stride_vs, stride_vh, stride_vd,  # V's strides (block, slot, head, dim)
    stride_sb, stride_sh,  # scale strides (block, head); the slot stride is 1
    stride_knt, stride_knh, stride_vnt, stride_vnh,  # k_new's and v_new's (token, head)
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr,
    TOKENS_PER_TILE: tl.constexpr,  # BLOCK_M // GROUP
    BLOCK_M: tl.constexpr,  # rows = tokens x heads of the group (power of two >= 16)
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,  # fp8 caches with per-token scales
    F16_MMA: tl.constexpr,  # KV_FP8 with a 16-bit query: products in fp16 (decode kernel doc)
    WINDOW: tl.constexpr = 0,  # sliding window in tokens; 0 = causal over the whole prefix
    V_DIM_MAJOR: tl.constexpr = False,  # V tiles read as [HEAD_DIM, BLOCK_N] (stride_vs 1)
    FP8_MMA: tl.constexpr = False,  # KV_FP8, V dim-major: query and probabilities in e4m3
    FRESH_CHUNK_KV: tl.constexpr = False,  # KV_FP8, WINDOW 0: the chunk's keys from k_new/v_new
    NARROW_M: tl.constexpr = 0,  # > 0 (WINDOW 0, not FP8_MMA): one-token chunks on this many
    # rows (max(16, GROUP rounded up)) instead of BLOCK_M
):
    kv_head = tl.program_id(0)
    q_tile = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    first_tok = q_tile * TOKENS_PER_TILE
    wide = first_tok < q_len  # this program's tokens, on the BLOCK_M-row tile
    if NARROW_M > 0:  # (a constexpr test, so that NARROW_M 0 compiles no narrow path)
        wide = wide & (q_len > 1)
        if (q_len == 1) & (q_tile == 0):
            _extend_decode_row(
                q_ptr, out_ptr, q_start, kv_head, tl.load(seq_lens_ptr + seq), scale_log2,
                stride_qt, stride_qh, stride_ot, stride_oh,
                k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_bt, kv_head * stride_ch,
                stride_cb, stride_cs, k_scales_ptr, v_scales_ptr, kv_head * stride_sh, stride_sb,
                kv_head * stride_vh, stride_vb, stride_vs, stride_vd,
                k_new_ptr, v_new_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh,
                GROUP, NARROW_M, BLOCK_SIZE, HEAD_DIM, BLOCK_N, UPCAST, DOT_PRECISION, KV_FP8,
                F16_MMA, V_DIM_MAJOR, FRESH_CHUNK_KV)
    if wide:
        seq_len = tl.load(seq_lens_ptr + seq)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        tok = first_tok + offs_m // GROUP
        head = kv_head * GROUP + offs_m % GROUP
        row_valid = (offs_m < TOKENS_PER_TILE * GROUP) & (tok < q_len)
        tok = tl.minimum(tok, q_len - 1)  # padding rows borrow a real token's position
        pos = seq_len - q_len + tok  # [BLOCK_M] absolute position of each row's token
        row_off = (q_start + tok).to(tl.int64)
        q = tl.load(q_ptr + row_off[:, None] * stride_qt + head[:, None] * stride_qh
                    + offs_d[None, :], mask=row_valid[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        context = seq_len - q_len  # cached tokens before this chunk
        kv_end = context + tl.minimum(first_tok + TOKENS_PER_TILE, q_len)  # p_last + 1
        cache_end = kv_end  # keys read from the cache: [.., cache_end)
        if FRESH_CHUNK_KV:  # the chunk's own keys 0 .. last token from k_new / v_new
            cache_end = context
            chunk_unmasked = ((first_tok + 1) // BLOCK_N) * BLOCK_N  # seen by every row
            k_rows = k_new_ptr + q_start.to(tl.int64) * stride_knt + kv_head * stride_knh
            v_rows = v_new_ptr + q_start.to(tl.int64) * stride_vnt + kv_head * stride_vnh
            acc, l_i, m_i = _extend_chunk_tiles(
                acc, l_i, m_i, q, tok, k_rows, v_rows, stride_knt, stride_vnt, scale_log2,
                0, chunk_unmasked, offs_d, BLOCK_N, False, UPCAST, DOT_PRECISION)
            acc, l_i, m_i = _extend_chunk_tiles(
                acc, l_i, m_i, q, tok, k_rows, v_rows, stride_knt, stride_vnt, scale_log2,
                chunk_unmasked, kv_end - context, offs_d, BLOCK_N, True, UPCAST, DOT_PRECISION)
        # new names, not q retyped: compiled triton (3.6) refuses a variable retyped inside a
        # runtime if
        q_mma, score_scale = _products_query(q, scale_log2, FP8_MMA, F16_MMA, UPCAST)

        bt_row = block_tables_ptr + seq * stride_bt
        head_off = kv_head * stride_ch
        scale_head_off = kv_head * stride_sh
        v_head_off = kv_head * stride_vh
        if WINDOW > 0:
            # lower band [lo, full_lo), keys every row sees [full_lo, kv_unmasked), upper band
            p_first = context + first_tok
            lo = tl.maximum(p_first - WINDOW + 1, 0)
            full_lo = tl.maximum(kv_end - WINDOW, lo)
            kv_unmasked = full_lo + (tl.maximum(p_first + 1 - full_lo, 0) // BLOCK_N) * BLOCK_N
            acc, l_i, m_i = _extend_tiles(
                acc, l_i, m_i, q_mma, pos, k_cache_ptr, v_cache_ptr, bt_row, head_off,
                stride_cb, stride_cs, score_scale, lo, full_lo, offs_d,
                k_scales_ptr, v_scales_ptr, scale_head_off, stride_sb,
                v_head_off, stride_vb, stride_vs, stride_vd,
                BLOCK_SIZE, BLOCK_N, True, UPCAST, DOT_PRECISION, WINDOW, KV_FP8, V_DIM_MAJOR,
                FP8_MMA)
        elif FRESH_CHUNK_KV:  # the cached prefix: every row sees it, the last tile masked
            full_lo = 0
            kv_unmasked = (context // BLOCK_N) * BLOCK_N
        else:
            # keys every row sees (no mask), then the diagonal band up to the last row's position
            full_lo = 0
            kv_unmasked = ((context + first_tok + 1) // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _extend_tiles(
            acc, l_i, m_i, q_mma, pos, k_cache_ptr, v_cache_ptr, bt_row, head_off,
            stride_cb, stride_cs, score_scale, full_lo, kv_unmasked, offs_d,
            k_scales_ptr, v_scales_ptr, scale_head_off, stride_sb,
            v_head_off, stride_vb, stride_vs, stride_vd,
            BLOCK_SIZE, BLOCK_N, False, UPCAST, DOT_PRECISION, WINDOW, KV_FP8, V_DIM_MAJOR, FP8_MMA)
        acc, l_i, m_i = _extend_tiles(
            acc, l_i, m_i, q_mma, pos, k_cache_ptr, v_cache_ptr, bt_row, head_off,
            stride_cb, stride_cs, score_scale, kv_unmasked, cache_end, offs_d,
            k_scales_ptr, v_scales_ptr, scale_head_off, stride_sb,
            v_head_off, stride_vb, stride_vs, stride_vd,
            BLOCK_SIZE, BLOCK_N, True, UPCAST, DOT_PRECISION, WINDOW, KV_FP8, V_DIM_MAJOR, FP8_MMA)

        out = acc / l_i[:, None]  # l_i >= 1: every row sees at least its own key
        tl.store(out_ptr + row_off[:, None] * stride_ot + head[:, None] * stride_oh
                 + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def _extend_launch_configs(head_dim: int, dtype: torch.dtype, on_gpu: bool,
                           kv_fp8: bool = False) -> list[dict]:
    """Launch configs, tuned first, then smaller ones that need less shared memory.

    H200, 4096-token causal prefill, 32/8 heads x 128, bf16: BLOCK_M 256 / BLOCK_N 64 /
    8 warps / 3 stages ran at 346 TFLOP/s, 128/64/8/3 at 300, 256/32 at 289, 256/128 at 226.
    fp32 tiles take twice the shared memory (256/64/8/3 needs 263 KB > the H200's 227 KB).
    Over an FP8 cache (kv_fp8) the kernel carries the conversion path too, and at BLOCK_M 256
    it ran 2.4x slower even where it reads no fp8 (H200, 2026-12-02, 4 prompts x 4,096
    tokens with their own rows, `benchmarks/diagnostics/fp8_prefill_step.py --sweep`):
    256/64/8/3 3.36 ms, 128/64/8/3 1.47 ms (bf16 at 256/64/8/3: 1.39 ms); every key read from
    the FP8 cache: 3.93 and 3.20 ms. So FP8 starts at 128/64/8/3.
    """
    def cfg(m, n, w, s):
        return {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s}
    small = [cfg(64, 32, 4, 2), cfg(32, 16, 4, 1)]
    if not on_gpu:  # interpreter: small tiles keep numpy fast
        return [cfg(16, 16, 4, 1)]
    if head_dim <= 64:
        return [cfg(128, 64, 4, 3)] + small
    if head_dim <= 128:
        first = [cfg(128, 64, 8, 3)] if dtype == torch.float32 or kv_fp8 else [
            cfg(256, 64, 8, 3), cfg(128, 64, 8, 3)]
        return first + small
    return [cfg(64, 32, 8, 2), cfg(32, 16, 4, 1)]


def paged_attention_extend_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    config: dict | None = None,
    *,
    validate: bool = True,
    sliding_window: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention for packed query chunks over cached prefixes (K/V already written).

    Args:
        query: [num_tokens, num_heads, head_dim], the caches' dtype (any of fp16/bf16/fp32
            over an FP8 cache), head_dim contiguous.
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], fp16/bf16/fp32,
            or float8_e4m3fn with k_scales and v_scales; v_cache may be a view of
            [num_blocks, num_kv_heads, head_dim, block_size] storage (`v_dim_major`).
        block_tables: [num_seqs, max_blocks_per_seq] int32.
        cu_seqlens_q: [num_seqs + 1] int32 prefix sums of the query lengths.
        seq_lens: [num_seqs] int32, cached tokens per sequence including this chunk.
        scale: softmax scale.
        max_query_len: longest chunk; None reads it from cu_seqlens_q (one device sync).
        config: launch overrides for tuning ({"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}).
        validate: check the arguments' contract (ValueError); the model's attention layers
            pass False for tensors they built (see `pagedrt.ops.fused_triton`).
        sliding_window: each query attends only to its last `sliding_window` positions (>= 1,
            itself included); None = the whole prefix. Blocks before every query's window are
            not read.
        k_scales, v_scales: an FP8 cache's scales, [num_blocks, num_kv_heads, block_size]
            float32 (`pagedrt.ops.fp8`); None for other caches.
        key, value: the chunks' own keys (rotated) and values, [num_tokens, num_kv_heads,
            head_dim] in query's dtype, head_dim contiguous, packed as query. Over an FP8 cache
            without a sliding window, each chunk attends to these rows (the model's writers
            leave them holding what the cache holds: `write_kv_triton`'s round_rows) and
            reads only its cached prefix from the cache (FRESH_CHUNK_KV, module doc);
            otherwise they are not read. None: every key from the cache.
    Returns:
        [num_tokens, num_heads, head_dim] in query's dtype.
    Raises:
        ValueError: (validate) a tensor's shape, dtype, device or layout breaks the above.
    """
    if validate:
        check_paged_args(query, k_cache, v_cache, block_tables, seq_lens, k_scales, v_scales)
        check_sliding_window(sliding_window)
        check_index("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,), k_cache.device)
        num_seqs = seq_lens.shape[0]
        if cu_seqlens_q.shape[0] != num_seqs + 1 or block_tables.shape[0] < num_seqs:
            raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries and "
                             f"block_tables {block_tables.shape[0]} rows for {num_seqs} sequences")
        if (key is None) != (value is None):
            raise ValueError("pass key and value together, or neither")
        kv_shape = (query.shape[0], k_cache.shape[2], k_cache.shape[3])
        for name, t in (("key", key), ("value", value)):
            if t is not None and (tuple(t.shape) != kv_shape or t.dtype != query.dtype
                                  or t.device != query.device or t.stride(-1) != 1):
                raise ValueError(
                    f"{name} is {tuple(t.shape)} {t.dtype} on {t.device} with strides "
                    f"{t.stride()}; it must be {kv_shape} {query.dtype} on {query.device}, "
                    "head_dim contiguous (the chunks' own K/V, packed as query)")
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_tokens, num_heads, _ = query.shape
    num_seqs = seq_lens.shape[0]
    out = torch.empty_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
    group = num_heads // num_kv_heads
    upcast = interpreting(query)
    fp8 = is_fp8(k_cache.dtype)
    if not fp8:
        k_scales = v_scales = out  # unused by the kernel
    fresh = fp8 and key is not None and not sliding_window
    if not fresh:
        key = value = query  # unused by the kernel (strides passed as for a K/V tensor)
    defaults = _extend_launch_configs(head_dim, query.dtype, on_gpu=not upcast, kv_fp8=fp8)
    override = None if config or fp8 else extend_config_override()
    configs = ([{**defaults[0], **config}] if config else
               [override] + defaults if override else defaults)

    def launch(cfg: dict) -> None:
        block_m = max(cfg["BLOCK_M"], next_pow2(group))
        tokens_per_tile = block_m // group
        grid = (num_kv_heads, triton.cdiv(max_query_len, tokens_per_tile), num_seqs)
        _extend_kernel[grid](
            query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out,
            k_scales, v_scales, key, value,
            scale * LOG2E,
            query.stride(0), query.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            *v_cache.stride(),
            k_scales.stride(0), k_scales.stride(1),
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            block_tables.stride(0),
            out.stride(0), out.stride(1),
            GROUP=group, TOKENS_PER_TILE=tokens_per_tile, BLOCK_M=block_m,
            BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_N=cfg["BLOCK_N"], UPCAST=upcast,
            DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32", KV_FP8=fp8,
            F16_MMA=fp8 and query.dtype != torch.float32,
            WINDOW=sliding_window or 0, V_DIM_MAJOR=dim_major, FP8_MMA=fp8_mma,
            FRESH_CHUNK_KV=fresh, NARROW_M=narrow_m,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )

    dim_major = v_dim_major(v_cache)
    fp8_mma = fp8 and dim_major and fp8_prefill_mma_requested()
    narrow_m = (max(16, next_pow2(group)) if not sliding_window and not fp8_mma
                and narrow_decode_rows_requested() else 0)
    cache_key = ("extend", str(query.device), query.dtype, head_dim, group, bool(config), fp8,
                 dim_major, fp8_mma, fresh, narrow_m, tuple((override or {}).values()))
    launch_first_fitting(cache_key, configs, launch)
    return out
