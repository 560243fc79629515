"""The QKV projection of a decode batch of 8 to 128 rows with RoPE and the K/V cache write in
its epilogue (issue 16): the tiled decode matmul's counterpart of the 1-4-row kernel in
pagedrt/ops/gemv_rope_triton.py, replacing two launches per layer (the QKV matmul and
`rotary_write_kv_triton`) with one.

A program owns BLOCK_M rows and BLOCK_N rotation pairs. Pair p of the projection's N / 2 pairs
is column lo = (p // (head_dim / 2)) * head_dim + p % (head_dim / 2) and column lo + head_dim / 2
(NeoX's rotate_half layout, `pagedrt/ops/fused_triton.py`); the program reads the weight rows
of both halves as two row sets in the same K loop as SwiGLU's gate and up rows
(`matmul_triton._tile_products`: one x tile, two MMAs per step), so both numbers RoPE mixes
are in its accumulators at the end. The epilogue is the 1-4-row kernel's (`_rope_qkv_store`):
the products rounded to the model dtype, query and key columns rotated in fp32 with each row's
cos and sin and rounded again, the qkv rows stored and the key and value columns written into
each row's cache slot (negative: none, a CUDA graph's padding rows). Caches in the model's
dtype only (not FP8), V in K's layout, no per-head q/k norm; whole K (no split-K).

`linear_qkv_rope` times it per (weight shape, rows, dtype, bias) against the plain pair, as
`matmul_triton.linear` times the plain matmul against cuBLAS (`matmul_triton._choice`: inside
the CUDA-graph runner's `timing()`, at the decode graphs' row counts). docs/design.md, "Decode
matmuls (8 to 128 rows)".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops import matmul_triton
from pagedrt.ops.gemv_rope_triton import _rope_operands, _rope_qkv_store, check_qkv_rope
from pagedrt.ops.matmul_triton import MIN_ROWS, SILU_CONFIGS, _tile_products
from pagedrt.ops.triton_utils import interpreting, pdl_enabled, pdl_launch, pdl_prologue

# (BLOCK_M, BLOCK_N pairs, BLOCK_K, num_warps, num_stages, swap_ab): the two-row-set tiles of
# the fused SwiGLU activation (the same loop), and two narrower ones: a program reads 2 x
# BLOCK_N weight rows, so at Qwen2-0.5B's 576 pairs BLOCK_N 64 leaves 9 column tiles
CONFIGS = SILU_CONFIGS + [(16, 32, 128, 4, 4, True), (16, 16, 128, 4, 4, True)]


@triton.jit
def _matmul_rope_kernel(
    x_ptr,  # [M, K], last dim contiguous
    w_ptr,  # [N, K] (N = q_size + 2 * kv_size), K contiguous
    b_ptr,  # [N], read only when HAS_BIAS
    y_ptr,  # [M, N] contiguous: q (rotated) | k (rotated) | v
    positions_ptr,  # [M] int
    cos_sin_ptr,  # [max_position, head_dim]: cos | sin
    slot_mapping_ptr,  # [M], negative: no cache write
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], head_dim contiguous
    v_cache_ptr,  # like k_cache
    M, K, num_pairs, q_size, kv_size,
    stride_xm, stride_wn, stride_c,
    stride_cb, stride_cs, stride_ch,  # K cache strides (block, slot, head)
    stride_vb, stride_vs, stride_vh,  # V cache strides
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,  # HEAD_DIM // 2
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # pairs per program
    BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_pid_m  # row tiles inner, as in _matmul_kernel
    pid_n = pid // num_pid_m
    offs_p = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_p = offs_p < num_pairs
    j = offs_p % HALF
    lo = (offs_p // HALF) * HEAD_DIM + j  # the pair's first column; its second is lo + HALF
    w_lo = w_ptr + lo.to(tl.int64)[:, None] * stride_wn
    pdl_prologue(PDL)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    # RoPE's operands first: their loads' latency passes under the K loop
    cos, sin, slot, b_lo, b_hi = _rope_operands(offs_m, mask_m, lo, j, mask_p, b_ptr,
                                                positions_ptr, cos_sin_ptr, slot_mapping_ptr,
                                                stride_c, HALF, HAS_BIAS)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc_lo, acc_hi = _tile_products(x_rows, w_lo, w_lo + HALF * stride_wn, mask_m, mask_p,
                                    0, K, K, BLOCK_M, BLOCK_N, BLOCK_K, True, SWAP_AB, EVEN_K,
                                    IEEE, UPCAST)
    _rope_qkv_store(acc_lo + b_lo[None, :], acc_hi + b_hi[None, :], cos, sin, slot, offs_m,
                    mask_m, lo, mask_p, y_ptr, k_cache_ptr, v_cache_ptr, q_size, kv_size,
                    stride_cb, stride_cs, stride_ch, stride_vb, stride_vs, stride_vh, HEAD_DIM,
                    HALF, BLOCK_SIZE)


def matmul_qkv_rope_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int,
                           config: tuple = CONFIGS[0]) -> torch.Tensor:
    """The QKV projection of x with RoPE on its query and key heads and the new key and value
    written into the caches, in one kernel: what `matmul_triton.matmul_triton` and then
    `fused_triton.rotary_write_kv_triton` on the projection's q, k and v views compute.

    Args:
        x: [M, K], M in MIN_ROWS..FUSED_MAX_ROWS (8-128, or to 256 with
            PAGEDRT_MATMUL_FUSED_MAX_ROWS), last dim contiguous; fp16, bf16 or fp32
            (fp32 products exact; bf16 under the interpreter multiplied in fp32).
        weight, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads,
            num_kv_heads: as `gemv_rope_triton.qkv_rope_triton` (weight [N, K] with q | k | v
            rows, caches [num_blocks, block_size, num_kv_heads, head_dim] in x's dtype,
            slot_mapping [M], negative: no write).
        config: (BLOCK_M, BLOCK_N pairs, BLOCK_K, num_warps, num_stages, swap_ab), `CONFIGS`'
            form; blocks powers of two >= 16.
    Returns:
        qkv [M, N] in x's dtype, q and k rotated.
    Raises:
        ValueError: shapes, dtypes or devices that do not fit, or a config out of form.
    """
    check_qkv_rope(x, weight, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                   num_heads, num_kv_heads, MIN_ROWS, matmul_triton.FUSED_MAX_ROWS)
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {x.dtype}: float16, bfloat16 or float32 only")
    if len(config) != 6 or any(b < 16 or b & (b - 1) for b in config[:3]):
        raise ValueError(f"config {config}: expected (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, "
                         "num_stages, swap_ab), the blocks powers of two >= 16")
    block_m, block_n, block_k, num_warps, num_stages, swap_ab = config
    (m, k), n = x.shape, weight.shape[0]
    head_dim = cos_sin_cache.shape[-1]
    num_pairs = n // 2
    upcast = x.dtype == torch.bfloat16 and interpreting(x)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(num_pairs, block_n),)
    _matmul_rope_kernel[grid](
        x, weight, bias if bias is not None else weight, y, positions, cos_sin_cache,
        slot_mapping, k_cache, v_cache,
        m, k, num_pairs, num_heads * head_dim, num_kv_heads * head_dim,
        x.stride(0), weight.stride(0), cos_sin_cache.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, HALF=head_dim // 2, BLOCK_SIZE=k_cache.shape[1],
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SWAP_AB=bool(swap_ab), EVEN_K=k % block_k == 0,
        IEEE=x.dtype == torch.float32 or upcast, UPCAST=upcast, num_warps=num_warps,
        num_stages=num_stages, **pdl_launch(pdl_enabled(x)),
    )
    return y


def linear_qkv_rope(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                    num_heads: int, num_kv_heads: int, baseline) -> tuple[torch.Tensor, bool]:
    """(qkv, rotated): `matmul_qkv_rope_triton`'s qkv and True where that was timed faster
    than `baseline()`, the plain path's QKV projection then RoPE and the K/V write (which
    must compute the same); else `baseline()`'s qkv and whether it rotated (it returns the
    pair too). Only for the tensors `matmul_triton.linear` takes (16-bit CUDA, the decode
    graphs' row counts) and a cache in x's dtype."""
    if not matmul_triton._eligible(x, weight, fused=True) or k_cache.dtype != x.dtype:
        return baseline()
    key = ("qkv_rope", weight.shape, x.shape[0], weight.dtype, bias is not None,
           weight.device.index)

    def fused(cfg):
        return matmul_qkv_rope_triton(x, weight, bias, positions, cos_sin_cache, k_cache,
                                      v_cache, slot_mapping, num_heads, num_kv_heads,
                                      cfg), True

    cfg = matmul_triton._choice(key, baseline, fused, CONFIGS)
    return baseline() if cfg is None else fused(cfg)
