"""The QKV projection of 1 to 4 decode rows with RoPE and the K/V cache write in its epilogue
(issue 16: a batch-1 step is bound by launches, and this one kernel replaces two: the skinny
QKV matmul, with or without the RMSNorm before it, and `rotary_write_kv_triton`).

Each program owns BLOCK_P rotation pairs: pair p of head h holds the columns h * head_dim + j
and h * head_dim + head_dim / 2 + j (j = p mod head_dim / 2; NeoX's rotate_half layout,
`pagedrt/ops/fused_triton.py`), so both halves that RoPE mixes are in the program's registers
when its K loop ends. The weight rows of the two halves are read as two row sets, each row once,
as the skinny matmul reads them (`pagedrt/ops/gemv_triton.py`, whose prologue code this
reuses). The epilogue rounds the products to the model dtype (the plain path's matmul output),
rotates query and key columns in fp32 with the position's cos and sin and rounds again (the
rotary kernel's arithmetic), stores the qkv row, and stores the key and value columns into the
cache slot of the row (`slot_mapping`, negative: none). On by default (PAGEDRT_FUSED_ROPE=0 turns
it off; batch-1 decode 3% shorter on the H200, benchmarks/results/RUNS.md, "Runs of 2026-12-04
(06:15-06:55 UTC)"); caches in the model's dtype only (not FP8), V in K's layout.
docs/design.md, "Small-batch decode".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.env_flags import env_flag
from pagedrt.ops.gemv_triton import (
    MAX_ROWS,
    _input_chunk,
    _rows_rstd,
    pre_wait_columns,
    rstd_block,
)
from pagedrt.ops.triton_utils import pdl_enabled, pdl_launch, pdl_prologue

ENABLED = env_flag("PAGEDRT_FUSED_ROPE")  # PAGEDRT_FUSED_ROPE=0: off
CONFIGS = [(4, 256, 4), (8, 256, 4), (16, 256, 4), (32, 128, 4)]  # (BLOCK_P, BLOCK_K, warps)


@triton.jit
def _qkv_rope_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] (N = q_size + 2 * kv_size), K contiguous
    b_ptr,  # [N], read only when HAS_BIAS
    y_ptr,  # [M, N] contiguous: q (rotated) | k (rotated) | v
    r_ptr,  # NORM with HAS_RESIDUAL: residual [M, K]
    nw_ptr,  # NORM: the RMSNorm weight [K]
    new_r_ptr,  # NORM with HAS_RESIDUAL: x + residual [M, K] contiguous, program 0 writes
    positions_ptr,  # [M] int
    cos_sin_ptr,  # [max_position, head_dim]: cos | sin
    slot_mapping_ptr,  # [M], negative: no cache write
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], head_dim contiguous
    v_cache_ptr,  # like k_cache
    num_pairs, K, q_size, kv_size,
    stride_xm, stride_wn, stride_rm, stride_c,
    stride_cb, stride_cs, stride_ch,  # K cache strides (block, slot, head)
    stride_vb, stride_vs, stride_vh,  # V cache strides
    eps,
    M: tl.constexpr,
    M_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,  # HEAD_DIM // 2
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HAS_BIAS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PROLOGUE: tl.constexpr,  # 1: the RMSNorm (with the residual add) first, 0: none
    HAS_RESIDUAL: tl.constexpr,
    RSTD_BLOCK: tl.constexpr,  # PROLOGUE 1: gemv_triton.rstd_block(K)
    PDL: tl.constexpr = False,
    PRE_K: tl.constexpr = 0,  # W's first PRE_K columns loaded before the PDL wait
):
    pid = tl.program_id(0)
    offs_p = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < num_pairs
    j = offs_p % HALF
    lo = (offs_p // HALF) * HEAD_DIM + j  # column of the pair's first half
    hi = lo + HALF
    w_lo_rows = w_ptr + lo.to(tl.int64)[:, None] * stride_wn
    w_hi_rows = w_ptr + hi.to(tl.int64)[:, None] * stride_wn
    if PRE_K > 0:  # the weights are no earlier kernel's output (`gemv_triton.pre_wait_columns`)
        offs_pre = tl.arange(0, PRE_K)
        mask_pre = offs_pre < K
        mask_w_pre = mask_p[:, None] & mask_pre[None, :]
        w_lo_pre = tl.load(w_lo_rows + offs_pre[None, :], mask=mask_w_pre, other=0.0)
        w_hi_pre = tl.load(w_hi_rows + offs_pre[None, :], mask=mask_w_pre, other=0.0)
    pdl_prologue(PDL)
    offs_k0 = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, M_PAD)
    rstd_m = tl.zeros((M_PAD,), dtype=tl.float32)
    if PROLOGUE == 1:  # each row's 1/rms, as the skinny matmul's prologue takes it
        rstd_m = _rows_rstd(x_ptr, r_ptr, new_r_ptr, stride_xm, stride_rm, K, eps, pid == 0,
                            M, M_PAD, RSTD_BLOCK, HAS_RESIDUAL)
    # RoPE's operands first: their loads' latency passes under the K loop
    cos, sin, slot, b_lo, b_hi = _rope_operands(offs_m, offs_m < M, lo, j, mask_p, b_ptr,
                                                positions_ptr, cos_sin_ptr, slot_mapping_ptr,
                                                stride_c, HALF, HAS_BIAS)
    acc_lo = tl.zeros((M_PAD, BLOCK_P), dtype=tl.float32)
    acc_hi = tl.zeros((M_PAD, BLOCK_P), dtype=tl.float32)
    if PRE_K > 0:
        acc_lo, acc_hi = _pair_products(acc_lo, acc_hi, w_lo_pre.to(tl.float32),
                                        w_hi_pre.to(tl.float32), x_ptr, r_ptr, nw_ptr,
                                        stride_xm, stride_rm, offs_pre, mask_pre, rstd_m, K,
                                        offs_m, M, PROLOGUE, HAS_RESIDUAL)
    for k0 in range(PRE_K, K, BLOCK_K):
        offs_k = k0 + offs_k0
        mask_k = offs_k < K
        mask_w = mask_p[:, None] & mask_k[None, :]
        w_lo = tl.load(w_lo_rows + offs_k[None, :], mask=mask_w, other=0.0).to(tl.float32)
        w_hi = tl.load(w_hi_rows + offs_k[None, :], mask=mask_w, other=0.0).to(tl.float32)
        acc_lo, acc_hi = _pair_products(acc_lo, acc_hi, w_lo, w_hi, x_ptr, r_ptr, nw_ptr,
                                        stride_xm, stride_rm, offs_k, mask_k, rstd_m, K,
                                        offs_m, M, PROLOGUE, HAS_RESIDUAL)
    _rope_qkv_store(acc_lo + b_lo[None, :], acc_hi + b_hi[None, :], cos, sin, slot, offs_m,
                    offs_m < M, lo, mask_p, y_ptr, k_cache_ptr, v_cache_ptr, q_size, kv_size,
                    stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, HEAD_DIM,
                    HALF, BLOCK_SIZE)


@triton.jit
def _pair_products(acc_lo, acc_hi, w_lo, w_hi, x_ptr, r_ptr, nw_ptr, stride_xm, stride_rm,
                   offs_k, mask_k, rstd_m, K, offs_m, M: tl.constexpr, PROLOGUE: tl.constexpr,
                   HAS_RESIDUAL: tl.constexpr):
    """acc_lo, acc_hi [M_PAD, BLOCK_P] plus each row's input at columns offs_k (after the
    prologue) times the two halves' weight columns w_lo, w_hi [BLOCK_P, len(offs_k)] fp32."""
    for m in tl.static_range(M):
        rstd = tl.sum(tl.where(offs_m == m, rstd_m, 0.0), axis=0)
        x = _input_chunk(x_ptr, r_ptr, nw_ptr, m, stride_xm, stride_rm, offs_k, mask_k,
                         rstd, K, PROLOGUE, HAS_RESIDUAL)
        row = offs_m[:, None] == m
        acc_lo = tl.where(row, acc_lo + tl.sum(w_lo * x[None, :], axis=1)[None, :], acc_lo)
        acc_hi = tl.where(row, acc_hi + tl.sum(w_hi * x[None, :], axis=1)[None, :], acc_hi)
    return acc_lo, acc_hi


@triton.jit
def _rope_operands(offs_m, mask_m, lo, j, mask_p, b_ptr, positions_ptr, cos_sin_ptr,
                   slot_mapping_ptr, stride_c, HALF: tl.constexpr, HAS_BIAS: tl.constexpr):
    """What the RoPE epilogue needs besides the products, loaded before the K loop (shared with
    pagedrt/ops/matmul_rope_triton.py): cos and sin [rows, pairs] fp32 at each row's position,
    each row's cache slot (int64; padding rows -1) and the bias of both halves' columns [pairs]
    fp32 (zeros without one)."""
    pos = tl.load(positions_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    cs = cos_sin_ptr + pos[:, None] * stride_c + j[None, :]
    mask = mask_m[:, None] & mask_p[None, :]
    cos = tl.load(cs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(cs + HALF, mask=mask, other=0.0).to(tl.float32)
    slot = tl.load(slot_mapping_ptr + offs_m, mask=mask_m, other=-1).to(tl.int64)
    if HAS_BIAS:
        b_lo = tl.load(b_ptr + lo, mask=mask_p, other=0.0).to(tl.float32)
        b_hi = tl.load(b_ptr + lo + HALF, mask=mask_p, other=0.0).to(tl.float32)
    else:
        b_lo = tl.zeros(lo.shape, dtype=tl.float32)
        b_hi = b_lo
    return cos, sin, slot, b_lo, b_hi


@triton.jit
def _rope_qkv_store(acc_lo, acc_hi, cos, sin, slot, offs_m, mask_m, lo, mask_p, y_ptr,
                    k_cache_ptr, v_cache_ptr, q_size, kv_size, stride_cb, stride_cs, stride_ch,
                    stride_vb, stride_vs, stride_vh, HEAD_DIM: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The epilogue shared with the decode matmul's (pagedrt/ops/matmul_rope_triton.py):
    acc_lo, acc_hi [rows, pairs] fp32 are the products (bias added) of rows `offs_m` with the
    weight rows `lo` (pair j's first half in its head) and lo + HALF; cos, sin and slot are
    `_rope_operands`'. Rounds the products to y's dtype (the matmul's output), rotates query
    and key columns in fp32 and rounds again (`rotary_write_kv_triton`'s arithmetic), stores
    the qkv rows and the key and value columns into each row's cache slot (negative: none)."""
    hi = lo + HALF
    dtype = y_ptr.dtype.element_ty
    x1 = acc_lo.to(dtype).to(tl.float32)  # the matmul's output, as the plain path stores it
    x2 = acc_hi.to(dtype).to(tl.float32)
    mask = mask_m[:, None] & mask_p[None, :]
    rotate = (lo < q_size + kv_size)[None, :]  # query and key heads; value heads as they are
    out1 = tl.where(rotate, x1 * cos - x2 * sin, x1).to(dtype)
    out2 = tl.where(rotate, x2 * cos + x1 * sin, x2).to(dtype)
    n = q_size + 2 * kv_size
    tl.store(y_ptr + offs_m[:, None] * n + lo[None, :], out1, mask=mask)
    tl.store(y_ptr + offs_m[:, None] * n + hi[None, :], out2, mask=mask)
    # key and value columns into the row's cache slot
    block, in_block = (slot // BLOCK_SIZE)[:, None], (slot % BLOCK_SIZE)[:, None]
    write = mask & (slot >= 0)[:, None]
    is_k = (lo >= q_size) & (lo < q_size + kv_size)
    is_v = lo >= q_size + kv_size
    col_k = lo - q_size  # kv_head * head_dim + j within the key's section
    col_v = lo - q_size - kv_size
    k_dst = (k_cache_ptr + block * stride_cb + in_block * stride_cs
             + ((col_k // HEAD_DIM) * stride_ch + col_k % HEAD_DIM)[None, :])
    v_dst = (v_cache_ptr + block * stride_vb + in_block * stride_vs
             + ((col_v // HEAD_DIM) * stride_vh + col_v % HEAD_DIM)[None, :])
    k_ty = k_cache_ptr.dtype.element_ty
    tl.store(k_dst, out1.to(k_ty), mask=write & is_k[None, :])
    tl.store(k_dst + HALF, out2.to(k_ty), mask=write & is_k[None, :])
    tl.store(v_dst, out1.to(k_ty), mask=write & is_v[None, :])
    tl.store(v_dst + HALF, out2.to(k_ty), mask=write & is_v[None, :])


def qkv_rope_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                    num_heads: int, num_kv_heads: int,
                    norm: tuple[torch.Tensor | None, torch.Tensor, float] | None = None,
                    config: tuple[int, int, int] = CONFIGS[1],
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The QKV projection of x with RoPE on its query and key heads and the new key and value
    written into the caches: what `gemv_triton` (or `gemv_rmsnorm_triton` with `norm`) and then
    `fused_triton.rotary_write_kv_triton` on the projection's q, k and v views compute.

    Args:
        x: [M, K], M in 1..4, last dim contiguous; fp16, bf16 or fp32.
        weight: [(num_heads + 2 * num_kv_heads) * head_dim, K] contiguous, x's dtype (q | k |
            v rows); bias: its [N] or None.
        positions: [M] int; cos_sin_cache: [max_position, head_dim] (cos | sin).
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], x's dtype,
            head_dim contiguous. slot_mapping: [M] int, negative: no write.
        num_heads, num_kv_heads: of this rank's projection.
        norm: None, or (residual or None, norm weight [K], eps): RMSNorm(x + residual) is the
            projection's input, as in `gemv_rmsnorm_triton`.
        config: (BLOCK_P pairs per program, BLOCK_K, num_warps).
    Returns:
        (qkv [M, N], q and k rotated; the new residual [M, K] or None).
    Raises:
        ValueError: shapes, dtypes or devices that do not fit.
    """
    check_qkv_rope(x, weight, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                   num_heads, num_kv_heads, 1, MAX_ROWS)
    m, k = x.shape
    n = weight.shape[0]
    head_dim = cos_sin_cache.shape[-1]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    residual, norm_weight, eps = norm if norm is not None else (None, x, 0.0)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    new_residual = torch.empty((m, k), dtype=x.dtype, device=x.device) if residual is not None \
        else None
    block_p, block_k, num_warps = config
    num_pairs = n // 2
    _qkv_rope_kernel[(triton.cdiv(num_pairs, block_p),)](
        x, weight, bias if bias is not None else weight, y,
        residual if residual is not None else x, norm_weight,
        new_residual if new_residual is not None else x,
        positions, cos_sin_cache, slot_mapping, k_cache, v_cache,
        num_pairs, k, q_size, kv_size,
        x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0,
        cos_sin_cache.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), eps,
        M=m, M_PAD=max(2, triton.next_power_of_2(m)), HEAD_DIM=head_dim, HALF=head_dim // 2,
        BLOCK_SIZE=k_cache.shape[1], HAS_BIAS=bias is not None, BLOCK_P=block_p,
        BLOCK_K=block_k, PROLOGUE=int(norm is not None), HAS_RESIDUAL=residual is not None,
        RSTD_BLOCK=rstd_block(k) if norm is not None else 16,
        PRE_K=pre_wait_columns(2 * block_p, k, num_warps), num_warps=num_warps,
        **pdl_launch(pdl_enabled(x)),
    )
    return y, new_residual


def check_qkv_rope(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   positions: torch.Tensor,
                   cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int,
                   min_rows: int, max_rows: int) -> None:
    """The argument checks of `qkv_rope_triton` and the decode matmul's
    `matmul_qkv_rope_triton` (rows from min_rows to max_rows): ValueError naming what does
    not fit."""
    m, k = x.shape if x.dim() == 2 else (0, -1)
    head_dim = cos_sin_cache.shape[-1]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    if (x.dim() != 2 or not min_rows <= m <= max_rows
            or weight.shape != (q_size + 2 * kv_size, k) or head_dim % 2
            or x.stride(-1) != 1 or not weight.is_contiguous()):
        raise ValueError(f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, {num_heads} + 2 x "
                         f"{num_kv_heads} heads of {head_dim}: expected {min_rows}-{max_rows} "
                         "rows of a contiguous [q | k | v, K] weight and an even head_dim")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"bias {tuple(bias.shape)} (stride {bias.stride()}); expected a "
                         f"contiguous ({weight.shape[0]},)")
    named = (("weight", weight), ("bias", bias), ("k_cache", k_cache), ("v_cache", v_cache))
    for name, t in ((n, t) for n, t in named if t is not None):
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; expected x's {x.dtype} on "
                             f"{x.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4 or t.shape[2:] != (num_kv_heads, head_dim) or t.stride(3) != 1:
            raise ValueError(f"{name} {tuple(t.shape)} (strides {t.stride()}): expected "
                             f"[num_blocks, block_size, {num_kv_heads}, {head_dim}], head_dim "
                             "contiguous")
    if positions.shape != (m,) or slot_mapping.shape != (m,):
        raise ValueError(f"positions {tuple(positions.shape)} and slot_mapping "
                         f"{tuple(slot_mapping.shape)} must be ({m},)")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if t.dtype not in (torch.int32, torch.int64) or t.device != x.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; expected int32 or int64 on "
                             f"{x.device}")
    if (cos_sin_cache.dim() != 2 or not cos_sin_cache.is_floating_point()
            or cos_sin_cache.stride(-1) != 1 or cos_sin_cache.device != x.device):
        raise ValueError(f"cos_sin_cache is {cos_sin_cache.dtype} {tuple(cos_sin_cache.shape)} "
                         f"on {cos_sin_cache.device}; expected a floating [max_position, "
                         f"head_dim] (cos | sin, last dim contiguous) on {x.device}")
