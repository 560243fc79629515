"""The deliberately naive v1 decode kernel: the baseline the benchmark compares against.

One program per (query head, sequence); no split-K; no sharing of K/V across a GQA group (each
query head re-reads its KV head, so K/V traffic is GROUP times the optimum); dot products as
elementwise multiply + sum instead of tl.dot. Same online softmax and masking as the real
kernel, so it is also a second, independent check of the math.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.fp8 import is_fp8
from pagedrt.ops.triton_utils import LOG2E, check_decode_args


@triton.jit
def _decode_naive_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    out_ptr,  # [num_seqs, num_heads, head_dim]
    scale_log2,
    stride_qs, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_bt,
    stride_os, stride_oh,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """v1 baseline: one program per (head, seq), no split, no sharing of K/V across the GQA
    group (each query head re-reads its KV head), dot products as multiply + sum."""
    head = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qs + head * stride_qh + offs_d).to(tl.float32)
    m_i = tl.max(tl.full([2], float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros([2], tl.float32), 0)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    head_off = (head // GROUP) * stride_ch
    for tile_start in range(0, seq_len, BLOCK_N):
        offs_n = tile_start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < seq_len
        block = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        kv_off = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + head_off
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=n_mask[:, None],
                    other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], 1) * scale_log2
        s = tl.where(n_mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.exp2(s - m_new)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=n_mask[:, None],
                    other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty))


def paged_attention_decode_naive_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The v1 baseline: one program per (sequence, query head), no GQA sharing, no split-K.

    Same arguments and result as `paged_attention_decode_triton`; kept for the benchmark.
    Caches of fp16/bf16/fp32 only (ValueError for an FP8 cache).
    """
    if is_fp8(k_cache.dtype):
        raise ValueError(f"the naive decode kernel reads fp16/bf16/fp32 caches, not "
                         f"{k_cache.dtype}; use paged_attention_decode_triton for an FP8 cache")
    group, _ = check_decode_args(query, k_cache, v_cache, block_tables, seq_lens)
    if v_cache.stride() != k_cache.stride():
        raise ValueError(f"the naive decode kernel reads V in K's layout: v_cache strides "
                         f"{v_cache.stride()} != k_cache strides {k_cache.stride()}")
    num_seqs, num_heads, head_dim = query.shape
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    _decode_naive_kernel[(num_heads, num_seqs)](
        query, k_cache, v_cache, block_tables, seq_lens, out, scale * LOG2E,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_N=32,
        num_warps=4,
    )
    return out
