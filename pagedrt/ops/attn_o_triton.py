"""The split-K decode attention's combine and the O projection of 1 to 4 decode rows in one
kernel, the projection split over the heads (issue 16: a batch-1 step is bound by launches;
this one kernel replaces the attention's reduce kernel and the O projection's).

The O projection's input is the heads' outputs side by side, so y = sum over heads h of
out_h @ W[:, h * head_dim:(h + 1) * head_dim].T. Program (h, j) combines head h's partitions
for the M rows as the reduce kernel does (weights exp2(lse - max lse), an empty partition
weighing 0; a row at a time, `_combine_row`), rounds the result to the model dtype (the
reduce kernel's output), and multiplies it by its BLOCK_N output rows of W at head h's
columns, storing an fp32 partial [M, BLOCK_N]. So each head's partitions are read by the
cdiv(N, BLOCK_N) programs of its row of the grid (from L2), and each weight element once.
The heads' partials of an output block are summed with an arrival counter per block
(pagedrt/ops/arrival_counters.py): the block's last program to arrive sums them (one
reduction tree of fixed shape over the heads, the same sum whoever is last), adds the bias and
writes y. The weight tile is loaded before
the PDL wait (`pdl_prologue`): no kernel writes it.

An earlier version combined the partitions in the O projection's prologue with the
projection split over its output columns (`e47669e`): every program then read every head's
partitions, 64 of them per head at batch 1, and it was never chosen (docs/design.md,
"Small-batch decode"). Here a program reads one head's.

Chosen per shape by timing against the reduce kernel and the projection
(`gemv_triton.fused_or_unfused`); opt-in (PAGEDRT_FUSED_ATTN_O=1) until measured on a GPU;
not under tensor parallelism. docs/design.md, "Small-batch decode".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.env_flags import env_flag
from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.decode_partials import DecodePartials
from pagedrt.ops.gemv_triton import MAX_ROWS
from pagedrt.ops.triton_utils import (
    check_head_dim,
    next_pow2,
    pdl_enabled,
    pdl_launch,
    pdl_prologue,
)

ENABLED = env_flag("PAGEDRT_FUSED_ATTN_O")  # PAGEDRT_FUSED_ATTN_O=1: on (off by default)
# (BLOCK_N, num_warps): output rows of W per program; at Qwen2-0.5B's O (896 x 896, 14 heads
# of 64) 64-256 rows give 56-196 programs
CONFIGS = [(64, 4), (128, 4), (128, 8), (256, 8)]


@triton.jit
def _combine_row(part_out_ptr, part_lse_ptr, row, num_splits, HEAD_DIM: tl.constexpr,
                 SPLITS_PAD: tl.constexpr):
    """[HEAD_DIM] fp32: one (sequence, head)'s output from its num_splits partitions at
    part_out[row:row + num_splits] and part_lse[row:row + num_splits], weighted as
    `attention_triton._combine_partials` weighs them (exp2(lse - max lse), 0 for an empty
    partition, over the weights' sum), for a single row, so that the tile held is
    [SPLITS_PAD, HEAD_DIM] whatever the program's row count."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_s = offs_s < num_splits
    lse = tl.load(part_lse_ptr + row + offs_s, mask=mask_s, other=float("-inf"))
    valid = lse > float("-inf")
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight = tl.where(valid, tl.exp2(tl.where(valid, lse - lse_max, 0.0)), 0.0)
    part = tl.load(part_out_ptr + (row + offs_s).to(tl.int64)[:, None] * HEAD_DIM
                   + offs_d[None, :], mask=mask_s[:, None], other=0.0)
    total = tl.sum(weight, 0)
    return tl.sum(part * weight[:, None], 0) / tl.where(total > 0, total, 1.0)


@triton.jit
def _attn_o_kernel(
    part_out_ptr,  # [M, num_heads, num_splits, HEAD_DIM] fp32
    part_lse_ptr,  # [M, num_heads, num_splits] fp32, log2 domain; -inf = empty
    w_ptr,  # [N, num_heads * HEAD_DIM] contiguous
    b_ptr,  # [N], read only when HAS_BIAS
    part_ptr,  # [num_heads, M, N] fp32: each head's share of y
    y_ptr,  # [M, N] contiguous
    counters_ptr,  # int32, one arrival counter per block of BLOCK_N outputs, all 0
    N, num_heads, num_splits,
    M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,  # num_heads rounded up to a power of two
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    head = tl.program_id(0)
    block = tl.program_id(1)
    offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_d = tl.arange(0, HEAD_DIM)
    # the weights are no earlier kernel's output: read them while it runs
    w = tl.load(w_ptr + offs_n.to(tl.int64)[:, None] * (num_heads * HEAD_DIM)
                + head * HEAD_DIM + offs_d[None, :], mask=mask_n[:, None], other=0.0)
    pdl_prologue(PDL)
    w = w.to(tl.float32)
    part = part_ptr + head.to(tl.int64) * M * N
    for m in tl.static_range(M):  # a row at a time: one [SPLITS_PAD, HEAD_DIM] tile live
        attn = _combine_row(part_out_ptr, part_lse_ptr, (m * num_heads + head) * num_splits,
                            num_splits, HEAD_DIM, SPLITS_PAD)
        # rounded as the reduce kernel's output is
        attn = attn.to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.store(part + m * N + offs_n, tl.sum(w * attn[None, :], axis=1), mask=mask_n)
    # count in; the block's last head sums the heads' shares
    # (pagedrt/ops/arrival_counters.py: a CTA barrier, then an acq_rel atomic)
    tl.debug_barrier()
    count = tl.atomic_add(counters_ptr + block, 1, sem="acq_rel", scope="gpu")
    if count == num_heads - 1:
        offs_h = tl.arange(0, HEADS_PAD)
        mask = (offs_h < num_heads)[:, None] & mask_n[None, :]
        for m in tl.static_range(M):
            shares = tl.load(part_ptr + (offs_h.to(tl.int64)[:, None] * M + m) * N
                             + offs_n[None, :], mask=mask, other=0.0, cache_modifier=".cg")
            y = tl.sum(shares, axis=0)
            if HAS_BIAS:
                y += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            tl.store(y_ptr + m * N + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask_n)
        tl.store(counters_ptr + block, 0)  # ready for the next launch (and graph replay)


def attn_o_triton(partials: DecodePartials, weight: torch.Tensor,
                  bias: torch.Tensor | None = None,
                  config: tuple[int, int] = (128, 4)) -> torch.Tensor:
    """`F.linear(reduce(partials).flatten(1), weight, bias)` in one kernel: the decode
    attention's split-K combine (`attention_triton.reduce_partials`) and the O projection,
    rounded where the two round (the combined output in the model dtype, then an fp32
    product rounded once).

    Args:
        partials: a split decode launch's `DecodePartials` for M (1..MAX_ROWS) sequences of
            num_heads heads of head_dim.
        weight: [N, num_heads * head_dim] contiguous, in partials.dtype, on its device.
        bias: [N] or None.
        config: (BLOCK_N, num_warps), `CONFIGS`.
    Returns:
        [M, N] in partials.dtype.
    Raises:
        ValueError: shapes, dtypes or devices that do not fit, naming them.
    """
    part_out, part_lse, num_splits, dtype = partials
    if (part_out.dim() != 4 or part_lse.shape != part_out.shape[:3]
            or part_out.dtype != torch.float32 or part_lse.dtype != torch.float32
            or not (part_out.is_contiguous() and part_lse.is_contiguous())):
        raise ValueError(f"part_out {tuple(part_out.shape)} {part_out.dtype} and part_lse "
                         f"{tuple(part_lse.shape)} {part_lse.dtype} must be contiguous fp32 "
                         "[M, heads, splits, head_dim] and [M, heads, splits]")
    m, num_heads, splits, head_dim = part_out.shape
    check_head_dim(head_dim)
    if not 1 <= m <= MAX_ROWS or splits != num_splits:
        raise ValueError(f"partials of {m} rows and {splits} splits (num_splits "
                         f"{num_splits}); this kernel serves 1 to {MAX_ROWS} rows")
    if weight.dim() != 2 or weight.shape[1] != num_heads * head_dim:
        raise ValueError(f"weight {tuple(weight.shape)} must be [N, {num_heads * head_dim}] "
                         f"for {num_heads} heads of {head_dim}")
    if weight.dtype != dtype or weight.device != part_out.device or not weight.is_contiguous():
        raise ValueError(f"weight is {weight.dtype} on {weight.device}; it must be contiguous "
                         f"{dtype} on {part_out.device}")
    n = weight.shape[0]
    if bias is not None and (bias.shape != (n,) or bias.dtype != dtype
                             or bias.device != weight.device):
        raise ValueError(f"bias is {bias.dtype} {tuple(bias.shape)} on {bias.device}; "
                         f"expected {dtype} ({n},) on {weight.device}")
    block_n, num_warps = config
    blocks = triton.cdiv(n, block_n)
    y = torch.empty((m, n), dtype=dtype, device=weight.device)
    part = torch.empty((num_heads, m, n), dtype=torch.float32, device=weight.device)
    _attn_o_kernel[(num_heads, blocks)](
        part_out, part_lse, weight, bias if bias is not None else weight, part, y,
        arrival_counters(weight.device, blocks), n, num_heads, num_splits,
        M=m, HEAD_DIM=head_dim, SPLITS_PAD=next_pow2(num_splits),
        HEADS_PAD=next_pow2(num_heads), BLOCK_N=block_n, HAS_BIAS=bias is not None,
        num_warps=num_warps, **pdl_launch(pdl_enabled(y)),
    )
    return y
