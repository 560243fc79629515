"""Skinny matmul y = x @ W.T (+ bias) for a few rows of x: the decode of small batches.

At batch 1 to 4 a decoder's linear layers are matrix-vector products: the time is reading W
once, and cuBLAS's kernels for these shapes reach well under the device's bandwidth (on the
H200, Qwen2-0.5B's down projection ran at about 1.2 TB/s through a split-K GEMM plus a
reduction kernel). This kernel streams W once with wide loads, each program owning BLOCK_N
output columns for all M rows, fp32 accumulation, bias added in the epilogue. At one row a
second kernel can be timed beside it (`_gemv_row_kernel`, `row_configs`; opt-in,
PAGEDRT_GEMV_ROW=1): a grid of a few programs per SM, each walking every P-th block of outputs
with its input row computed once and the next block's weights in flight while it multiplies
the current one.

`linear` picks, once per (N, K, M, dtype), the faster of this kernel (over a few tile
configs) and `torch.nn.functional.linear`, timed on the device outside CUDA-graph capture;
under capture, a shape not yet timed falls back to torch.

The same kernel takes an optional prologue on its input, which removes a kernel launch and a
round trip of the activations per fused op (issue 16: at batch 1 a decode step is ~10 small
kernels per layer, and each launch costs more than its bytes): `gemv_rmsnorm_triton` folds
RMSNorm (with the residual add) into the projection after it (QKV, gate/up), and
`gemv_silu_mul_triton` folds SwiGLU's silu(gate) * up into the down projection. Both round
where the torch modules round, so they agree with the unfused chain up to the order of fp32
sums; `fused_or_unfused` times them against that chain per shape, as `linear` does.
docs/design.md ("Small-batch decode") has the layer picture.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from pagedrt.env_flags import env_flag
from pagedrt.ops.config_timing import fastest_config, note_use
from pagedrt.ops.triton_utils import (
    device_sms,
    pdl_enabled,
    pdl_launch,
    pdl_prologue,
)

MAX_ROWS = 4  # rows of x (tokens) this path serves
ENABLED = env_flag("PAGEDRT_GEMV")  # PAGEDRT_GEMV=0: always torch

# (BLOCK_N, BLOCK_K, num_warps): tiles of W of 2-16 KB, read once each
CONFIGS = [(4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 256, 4), (16, 512, 8), (32, 128, 4),
           (32, 256, 8), (64, 128, 8)]
# long-K tiles, also timed where CONFIGS' narrowest tile (4 rows) leaves fewer than two
# programs per SM (`candidate_configs`): Qwen2-0.5B's down projection (N = 896, K = 4,864:
# 224 programs on the H200's 132 SMs) read at about 1.3 TB/s in a batch-1 step with 512-column
# tiles, a few KB in flight per SM where HBM needs tens (Little's law: ~4 TB/s times ~1 us);
# each loop step here loads 4-8 KB per program. One- and two-row tiles of 512-1,024 columns
# were timed there and gained nothing (benchmarks/results/RUNS.md, "Runs of 2026-12-04
# (14:30-15:25 UTC)")
WIDE_K_CONFIGS = [(4, 1024, 4), (4, 2048, 8), (2, 2048, 4), (8, 1024, 8)]


def wide_k_configs(n: int, sms: int) -> list[tuple[int, int, int]]:
    """WIDE_K_CONFIGS where 4-row tiles of a weight of `n` rows give under 2 programs per SM
    of a GPU of `sms` multiprocessors, else none."""
    return WIDE_K_CONFIGS if triton.cdiv(n, 4) < 2 * sms else []


# One-row configs of `_gemv_row_kernel`, (BLOCK_N, BLOCK_K, num_warps, programs per SM): four
# values, which is how `_launch` tells them from the grid kernel's three. A program keeps its
# whole input row and two blocks of weights in registers, so they are timed only at one row
# and where a block is at most 64 weight values per thread (`row_configs`), and only with
# PAGEDRT_GEMV_ROW=1 (opt-in: docs/design.md, "Small-batch decode", has the measurements).
# On an H100 the kernel read Qwen2-0.5B's gate/up weight (17.4 MB, cold) in 6.18 us at (4,
# 1,024, 4, 8) against 7.05 for the best grid config and 6.08 for a kernel that only reads it
# (benchmarks/diagnostics/read_floor.py), and the start-up timing took it for QKV, O and
# gate/up, but batch-1 decode was not reliably faster (benchmarks/results/RUNS.md, "Runs of
# 2026-12-07 (09:25-10:50 UTC)").
ROW_ENABLED = env_flag("PAGEDRT_GEMV_ROW")
ROW_TILES = ((8, 4), (4, 4), (2, 4), (4, 8), (2, 8), (1, 8))  # (BLOCK_N, num_warps), preferred first
ROW_PROGRAMS_PER_SM = 8
ROW_MAX_K = 16384  # one 8-warp program holds a 16,384-column row of weights and of x


def row_configs(k: int, rows: int) -> list[tuple[int, int, int, int]]:
    """The first three of ROW_TILES whose block of BLOCK_N rows of a K = `k` weight fits 64
    values per thread, as one-row configs; none unless `rows` is 1 and k <= ROW_MAX_K. The
    configs the start-up timing tries only with PAGEDRT_GEMV_ROW=1 (`candidate_configs`,
    `fused_or_unfused`)."""
    if rows != 1 or k > ROW_MAX_K:
        return []
    block_k = triton.next_power_of_2(k)
    return [(block_n, block_k, warps, ROW_PROGRAMS_PER_SM) for block_n, warps in ROW_TILES
            if block_n * block_k <= 64 * 32 * warps][:3]


def candidate_configs(n: int, sms: int, k: int = 0, rows: int = 0) -> list[tuple]:
    """The tile configs `linear` times for a weight of `n` rows (and `k` columns, for `rows`
    rows of x) on a GPU of `sms` multiprocessors: CONFIGS, `wide_k_configs` and, with
    PAGEDRT_GEMV_ROW=1, `row_configs`."""
    return CONFIGS + wide_k_configs(n, sms) + (row_configs(k, rows) if ROW_ENABLED else [])


@triton.jit
def _input_chunk(x_ptr, r_ptr, nw_ptr, row, stride_xm, stride_rm, offs_k, mask_k, rstd, half,
                 PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Row `row` of the matmul's input at columns offs_k, fp32, after the prologue, rounded
    where the unfused torch modules round (pagedrt/ops/fused_triton.py's rules)."""
    dt = x_ptr.dtype.element_ty
    if PROLOGUE == 2:  # silu(gate) * up of x = [gate | up]
        gate = tl.load(x_ptr + row * stride_xm + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_xm + half + offs_k, mask=mask_k,
                     other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
        return (act * up).to(dt).to(tl.float32)
    x = tl.load(x_ptr + row * stride_xm + offs_k, mask=mask_k, other=0.0)
    if PROLOGUE == 1:  # RMSNorm of (x + residual), times the norm's weight
        if HAS_RESIDUAL:
            r = tl.load(r_ptr + row * stride_rm + offs_k, mask=mask_k, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(dt)
        normed = (x.to(tl.float32) * rstd).to(dt)
        nw = tl.load(nw_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        x = (nw * normed.to(tl.float32)).to(dt)
    return x.to(tl.float32)


@triton.jit
def _rows_rstd(x_ptr, r_ptr, new_r_ptr, stride_xm, stride_rm, K, eps, write_residual,
               M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_K: tl.constexpr,
               HAS_RESIDUAL: tl.constexpr):
    """[M_PAD] fp32: 1/rms of each of the M rows of x (+ residual, summed as RMSNorm sums it),
    0 past M; with `write_residual` also stores x + residual ([M, K] contiguous). BLOCK_K:
    `rstd_block(K)`, the whole row at once where it fits, so that a program pays one round
    trip to L2 per row before its weight loads, not K / BLOCK_K of them."""
    offs_m = tl.arange(0, M_PAD)
    offs_k0 = tl.arange(0, BLOCK_K)
    rstd_m = tl.zeros((M_PAD,), dtype=tl.float32)
    for m in tl.static_range(M):
        ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + offs_k0
            mask_k = offs_k < K
            x = tl.load(x_ptr + m * stride_xm + offs_k, mask=mask_k, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(r_ptr + m * stride_rm + offs_k, mask=mask_k, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
                if write_residual:
                    tl.store(new_r_ptr + m * K + offs_k, x, mask=mask_k)
            xf = x.to(tl.float32)
            ss += xf * xf
        rstd = tl.math.rsqrt(tl.sum(ss, axis=0) / K + eps)
        rstd_m = tl.where(offs_m == m, rstd, rstd_m)
    return rstd_m


@triton.jit
def _rows_products(acc, w, x_ptr, r_ptr, nw_ptr, stride_xm, stride_rm, offs_k, mask_k, rstd_m,
                   K, offs_m, M: tl.constexpr, PROLOGUE: tl.constexpr,
                   HAS_RESIDUAL: tl.constexpr):
    """acc [M_PAD, BLOCK_N] plus each of the M rows' input at columns offs_k (after the
    prologue, 1/rms from rstd_m [M_PAD]) times the weight columns w [BLOCK_N, len(offs_k)]
    fp32."""
    for m in tl.static_range(M):
        rstd = tl.sum(tl.where(offs_m == m, rstd_m, 0.0), axis=0)
        x = _input_chunk(x_ptr, r_ptr, nw_ptr, m, stride_xm, stride_rm, offs_k, mask_k, rstd,
                         K, PROLOGUE, HAS_RESIDUAL)
        part = tl.sum(w * x[None, :], axis=1)  # [BLOCK_N]
        acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
    return acc


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K] (PROLOGUE 2: [M, 2K], gate | up)
    w_ptr,  # [N, K], K contiguous
    b_ptr,  # [N], read only when HAS_BIAS
    y_ptr,  # [M, N] contiguous
    r_ptr,  # PROLOGUE 1 with HAS_RESIDUAL: residual [M, K]
    nw_ptr,  # PROLOGUE 1: the RMSNorm weight [K]
    new_r_ptr,  # PROLOGUE 1 with HAS_RESIDUAL: x + residual [M, K] contiguous, program 0 writes
    N, K,
    stride_xm, stride_wn, stride_rm,
    eps,
    M: tl.constexpr,
    M_PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PROLOGUE: tl.constexpr = 0,  # 0 none, 1 RMSNorm (+ residual add), 2 silu(gate) * up
    HAS_RESIDUAL: tl.constexpr = False,
    RSTD_BLOCK: tl.constexpr = 16,  # PROLOGUE 1: `rstd_block(K)`
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (pdl_enabled)
    PRE_K: tl.constexpr = 0,  # W's first PRE_K columns loaded before the PDL wait (`pre_wait_columns`)
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    if PRE_K > 0:  # the weights are no earlier kernel's output: read them while it runs
        offs_pre = tl.arange(0, PRE_K)
        mask_pre = offs_pre < K
        w_pre = tl.load(w_rows + offs_pre[None, :], mask=mask_n[:, None] & mask_pre[None, :],
                        other=0.0)
    pdl_prologue(PDL)
    offs_k0 = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, M_PAD)
    # RMSNorm: every program first takes each row's 1/rms itself (x is small and in L2)
    rstd_m = tl.zeros((M_PAD,), dtype=tl.float32)
    if PROLOGUE == 1:
        rstd_m = _rows_rstd(x_ptr, r_ptr, new_r_ptr, stride_xm, stride_rm, K, eps, pid == 0,
                            M, M_PAD, RSTD_BLOCK, HAS_RESIDUAL)
    if M == 1:
        # one row: keep the products per lane and reduce once at the end
        rstd0 = tl.sum(tl.where(offs_m == 0, rstd_m, 0.0), axis=0)
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if PRE_K > 0:
            x_pre = _input_chunk(x_ptr, r_ptr, nw_ptr, 0, stride_xm, stride_rm, offs_pre,
                                 mask_pre, rstd0, K, PROLOGUE, HAS_RESIDUAL)
            acc1 = tl.sum(w_pre.to(tl.float32) * x_pre[None, :], axis=1)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(PRE_K, K, BLOCK_K):
            offs_k = k0 + offs_k0
            mask_k = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                        other=0.0)
            x = _input_chunk(x_ptr, r_ptr, nw_ptr, 0, stride_xm, stride_rm, offs_k, mask_k,
                             rstd0, K, PROLOGUE, HAS_RESIDUAL)
            acc2 += w.to(tl.float32) * x[None, :]
        acc1 += tl.sum(acc2, axis=1)  # [BLOCK_N]
        if HAS_BIAS:
            acc1 += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, acc1.to(y_ptr.dtype.element_ty), mask=mask_n)
    else:
        acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
        if PRE_K > 0:
            acc = _rows_products(acc, w_pre.to(tl.float32), x_ptr, r_ptr, nw_ptr, stride_xm,
                                 stride_rm, offs_pre, mask_pre, rstd_m, K, offs_m, M, PROLOGUE,
                                 HAS_RESIDUAL)
        for k0 in range(PRE_K, K, BLOCK_K):
            offs_k = k0 + offs_k0
            mask_k = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                        other=0.0).to(tl.float32)
            acc = _rows_products(acc, w, x_ptr, r_ptr, nw_ptr, stride_xm, stride_rm, offs_k,
                                 mask_k, rstd_m, K, offs_m, M, PROLOGUE, HAS_RESIDUAL)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        y = y_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & mask_n[None, :])


@triton.jit
def _gemv_row_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, nw_ptr, new_r_ptr,  # as `_gemv_kernel`, one row
    N, K, stride_wn, eps,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # K rounded up to a power of two: the whole row at once
    PROLOGUE: tl.constexpr = 0,
    HAS_RESIDUAL: tl.constexpr = False,
    RSTD_BLOCK: tl.constexpr = 16,
    PDL: tl.constexpr = False,
):
    """One row of x: program p computes the blocks of BLOCK_N outputs p, p + P, ... (P
    programs), its input row taken once (after the prologue) and each next block's weights
    loaded before this block's products, so that every program keeps a block in flight
    (`row_configs`). The first block is loaded before the PDL wait."""
    pid = tl.program_id(0)
    num_progs = tl.num_programs(0)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    rows = tl.arange(0, BLOCK_N)
    offs_n = pid * BLOCK_N + rows
    w = tl.load(w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :],
                mask=(offs_n < N)[:, None] & mask_k[None, :], other=0.0)
    pdl_prologue(PDL)
    rstd = 0.0
    if PROLOGUE == 1:
        rstd_m = _rows_rstd(x_ptr, r_ptr, new_r_ptr, 0, 0, K, eps, pid == 0, 1, 2, RSTD_BLOCK,
                            HAS_RESIDUAL)
        rstd = tl.sum(tl.where(tl.arange(0, 2) == 0, rstd_m, 0.0), axis=0)
    x = _input_chunk(x_ptr, r_ptr, nw_ptr, 0, 0, 0, offs_k, mask_k, rstd, K, PROLOGUE,
                     HAS_RESIDUAL)
    for block in range(pid, tl.cdiv(N, BLOCK_N), num_progs):
        offs_n = block * BLOCK_N + rows
        next_n = offs_n + num_progs * BLOCK_N
        w_next = tl.load(w_ptr + next_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :],
                         mask=(next_n < N)[:, None] & mask_k[None, :], other=0.0)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)
        w = w_next


def _pre_wait_values(env: str | None) -> int:
    """PAGEDRT_GEMV_PRE_VALUES: W's values per thread a 1-4-row program holds across the PDL
    wait (`pre_wait_columns`), 64 unless set; 0 turns the pre-load off.

    Raises:
        ValueError: not 0 or a power of two from 16 to 512.
    """
    if env is None:
        return 64
    value = int(env) if env.strip().isdigit() else -1
    if value != 0 and not (16 <= value <= 512 and value & (value - 1) == 0):
        raise ValueError(f"PAGEDRT_GEMV_PRE_VALUES={env!r}: give 0 (no weights loaded before "
                         "the PDL wait) or a power of two from 16 to 512 (default 64)")
    return value


# values of W per thread a program holds across the PDL wait (`pre_wait_columns`)
PRE_WAIT_VALUES_PER_THREAD = _pre_wait_values(os.environ.get("PAGEDRT_GEMV_PRE_VALUES"))


def pre_wait_columns(w_rows: int, k: int, num_warps: int) -> int:
    """PRE_K of the 1-4-row kernels (`_gemv_kernel`, gemv_rope_triton's): how many of K's
    columns of its `w_rows` weight rows a program loads before its PDL wait, so that the
    weights stream from memory while the kernel before it still runs (they are no kernel's
    output; the activations are read after the wait). The largest power of two up to K's
    (rounded up) that keeps PRE_WAIT_VALUES_PER_THREAD values per thread (64, or
    PAGEDRT_GEMV_PRE_VALUES), 0 where that is under 16 columns. The same code runs without
    PDL (the loads are then the loop's first)."""
    cols = min(triton.next_power_of_2(k),
               PRE_WAIT_VALUES_PER_THREAD * 32 * num_warps // max(1, w_rows))
    cols = 1 << (max(cols, 1).bit_length() - 1)  # a power of two
    return cols if cols >= 16 else 0


def rstd_block(k: int) -> int:
    """The RMSNorm prologue's columns per load of a row (`_rows_rstd`): the row's K rounded up
    to a power of two, at most 8,192 (32 KB of fp32 over a program's threads)."""
    return min(triton.next_power_of_2(k), 8192)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           gate_up: bool = False) -> None:
    """ValueError unless x [M, K] (or [M, 2K] with `gate_up`) and weight [N, K] fit the
    kernel: 1..MAX_ROWS rows, one dtype and device, contiguous last dims, bias [N] or None."""
    width = weight.shape[-1] * (2 if gate_up else 1)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} do not "
                         + ("fit the silu prologue (x is [M, 2K] for a [N, K] weight)"
                            if gate_up else "multiply"))
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; this kernel serves 1 to {MAX_ROWS}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"x is {x.dtype} on {x.device}, weight {weight.dtype} on "
                         f"{weight.device}; they must match")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError("x's last dim and weight must be contiguous")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; expected ({weight.shape[0]},)")


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            config: tuple[int, ...], prologue: int,
            norm: tuple[torch.Tensor | None, torch.Tensor, float] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y [M, N] = prologue(x) @ weight.T (+ bias), the new residual or None) for prologue 0
    (none), 1 (RMSNorm; `norm` = (residual or None, norm weight, eps)) or 2 (silu(gate) * up);
    arguments already checked."""
    m = x.shape[0]
    n, k = weight.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    residual, norm_weight, eps = norm if norm is not None else (None, x, 0.0)
    new_residual = (torch.empty_like(x, memory_format=torch.contiguous_format)
                    if residual is not None else None)
    if len(config) == 4:  # `row_configs`: the one-row kernel
        block_n, block_k, num_warps, per_sm = config
        if m != 1 or block_k < k:
            raise ValueError(f"config {config} is a one-row config for K <= {block_k}; got "
                             f"{m} rows of K = {k}: use a (BLOCK_N, BLOCK_K, num_warps) config")
        _gemv_row_kernel[(min(per_sm * device_sms(x), triton.cdiv(n, block_n)),)](
            x, weight, bias if bias is not None else weight, y,
            residual if residual is not None else x, norm_weight,
            new_residual if new_residual is not None else x, n, k, weight.stride(0), eps,
            HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, PROLOGUE=prologue,
            HAS_RESIDUAL=residual is not None, RSTD_BLOCK=rstd_block(k) if prologue == 1 else 16,
            num_warps=num_warps, **pdl_launch(pdl_enabled(x)),
        )
        return y, new_residual
    block_n, block_k, num_warps = config
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y,
        residual if residual is not None else x, norm_weight,
        new_residual if new_residual is not None else x,
        n, k, x.stride(0), weight.stride(0),
        residual.stride(0) if residual is not None else 0, eps,
        M=m, M_PAD=max(2, triton.next_power_of_2(m)), HAS_BIAS=bias is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, PROLOGUE=prologue,
        HAS_RESIDUAL=residual is not None, RSTD_BLOCK=rstd_block(k) if prologue == 1 else 16,
        PRE_K=pre_wait_columns(block_n, k, num_warps), num_warps=num_warps,
        **pdl_launch(pdl_enabled(x)),
    )
    return y, new_residual


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                config: tuple[int, ...] = (8, 256, 4)) -> torch.Tensor:
    """y = x @ weight.T (+ bias) with the skinny kernel.

    Args:
        x: [M, K], M in 1..MAX_ROWS, last dim contiguous; fp16, bf16 or fp32.
        weight: [N, K], contiguous, same dtype and device.
        bias: [N] or None.
        config: (BLOCK_N, BLOCK_K, num_warps), or at one row a `row_configs` config
            (BLOCK_N, BLOCK_K >= K, num_warps, programs per SM).
    Returns:
        [M, N] in x's dtype.
    Raises:
        ValueError: shapes, dtypes or devices that do not match; a one-row config for more
            rows or a longer K.
    """
    _check(x, weight, bias)
    return _launch(x, weight, bias, config, prologue=0)[0]


def gemv_rmsnorm_triton(x: torch.Tensor, residual: torch.Tensor | None,
                        norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                        bias: torch.Tensor | None = None,
                        config: tuple[int, ...] = (8, 256, 4),
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`linear(RMSNorm(x + residual), weight, bias)` in one kernel: the RMSNorm of
    `pagedrt.models.layers.RMSNorm` (rounded where it rounds) is the matmul's prologue.

    Args:
        x: [M, K], M in 1..MAX_ROWS, last dim contiguous; fp16, bf16 or fp32.
        residual: None or [M, K] like x (last dim contiguous).
        norm_weight: [K], x's dtype. eps: the norm's epsilon.
        weight: [N, K] contiguous, x's dtype; bias: [N] or None.
        config: (BLOCK_N, BLOCK_K, num_warps), or at one row a `row_configs` config
            (BLOCK_N, BLOCK_K >= K, num_warps, programs per SM).
    Returns:
        (y [M, N], new_residual [M, K] = x + residual in x's dtype, or None without residual).
    Raises:
        ValueError: shapes, dtypes or devices that do not match.
    """
    _check(x, weight, bias)
    k = x.shape[1]
    if norm_weight.shape != (k,) or norm_weight.dtype != x.dtype:
        raise ValueError(f"norm_weight is {norm_weight.dtype} {tuple(norm_weight.shape)}; "
                         f"expected {x.dtype} ({k},)")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                 or residual.stride(1) != 1):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must be like x "
                         f"{tuple(x.shape)} {x.dtype}, last dim contiguous")
    return _launch(x, weight, bias, config, prologue=1, norm=(residual, norm_weight, eps))


def gemv_silu_mul_triton(x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None,
                         config: tuple[int, ...] = (8, 256, 4)) -> torch.Tensor:
    """`linear(silu(x[:, :K]) * x[:, K:], weight, bias)` in one kernel: SwiGLU's activation
    (rounded as `pagedrt.models.layers.SiluAndMul` rounds) is the matmul's prologue.

    Args:
        x: [M, 2K] (gate | up), M in 1..MAX_ROWS, last dim contiguous; fp16, bf16 or fp32.
        weight: [N, K] contiguous, x's dtype; bias: [N] or None.
        config: (BLOCK_N, BLOCK_K, num_warps), or at one row a `row_configs` config
            (BLOCK_N, BLOCK_K >= K, num_warps, programs per SM).
    Returns:
        y [M, N] in x's dtype.
    Raises:
        ValueError: shapes, dtypes or devices that do not match.
    """
    _check(x, weight, bias, gate_up=True)
    return _launch(x, weight, bias, config, prologue=2)[0]


_CHOICE: dict[tuple, tuple[int, ...] | None] = {}  # shape key -> config, None = torch


def _plain_key(weight: torch.Tensor, rows: int, has_bias: bool) -> tuple:
    """`_CHOICE`'s key: the weight's shape, dtype and device, the rows, whether a bias."""
    return (weight.shape, rows, weight.dtype, has_bias, weight.device.index)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the skinny kernel where that was timed faster."""
    m = x.shape[0] if x.dim() == 2 else 0
    if not (ENABLED and x.is_cuda and 1 <= m <= MAX_ROWS and x.stride(-1) == 1
            and weight.is_contiguous()):
        return F.linear(x, weight, bias)
    key = _plain_key(weight, m, bias is not None)  # (x's dtype and device are weight's)
    if key not in _CHOICE:
        if torch.cuda.is_current_stream_capturing():
            return F.linear(x, weight, bias)
        _CHOICE[key] = fastest_config(lambda: F.linear(x, weight, bias),
                                      lambda cfg: gemv_triton(x, weight, bias, cfg),
                                      candidate_configs(weight.shape[0], device_sms(x),
                                                        weight.shape[1], m), rep=20,
                                      record=(_CHOICE, key, m))
    cfg = _CHOICE[key]
    note_use(_CHOICE, key)
    return F.linear(x, weight, bias) if cfg is None else gemv_triton(x, weight, bias, cfg)


_FUSED_CHOICE: dict[tuple, tuple[int, ...] | None] = {}  # key -> config, None = unfused


FUSED_DEFAULT = (8, 256, 4)  # tried for every fused op, beside the plain matmul's choice
# also tried for one row, where the layer's step is a chain of launches: the best fused
# configs at Qwen2-0.5B's batch 1 on the H200 (RMSNorm + gate/up 4.76 us at (32, 128, 4)
# against the norm + matmul chain's 5.07; silu + down 5.03 at (8, 512, 4) against 6.13;
# neither among the two tried before; benchmarks/results/RUNS.md, "Runs of 2026-12-04
# (08:45-09:25 UTC)"); and (16, 256, 4), the fastest RMSNorm + gate/up tile inside a batch-1
# step, which the timing saw only when the plain matmul had chosen it
# (benchmarks/results/RUNS.md, "Runs of 2026-12-04 (20:40-21:35 UTC)")
FUSED_ONE_ROW = ((32, 128, 4), (8, 512, 4), (16, 256, 4))


def fused_margin() -> float:
    """PAGEDRT_FUSED_MARGIN, read when a fused op is timed: a fused op replaces its chain where
    it times below this fraction of the chain's time (default 1.0: wherever it times faster
    at all; the other timed choices ask their baseline for 5%).

    Why 1.0: the fused op is the chain less a launch. At batch 1 the RMSNorm + gate/up op of
    Qwen2-0.5B timed 4-6% faster than its chain alone on an H100, so under a 5% margin the
    choice went either way between start-ups (the chain in call_s119, 25 norm launches and 36
    us of a 713 us step; the fused op in all five processes of call_s121), while inside whole
    decode steps the chain was slower than every fused tile but one (0.696 against 0.625-0.690
    ms per token on the H200; benchmarks/results/RUNS.md, "Runs of 2026-12-04 (20:40-21:35
    UTC)" and "Runs of 2026-12-06 (11:24-11:28 UTC)").

    Raises:
        ValueError: a value that is not a number in (0, 2], naming it.
    """
    value = os.environ.get("PAGEDRT_FUSED_MARGIN", "1.0")
    try:
        margin = float(value)
    except ValueError:
        margin = float("nan")
    if not 0 < margin <= 2:
        raise ValueError(f"PAGEDRT_FUSED_MARGIN={value!r}; give a number in (0, 2]: a fused op "
                         "is taken where it times below that fraction of its chain's time "
                         "(1.0 by default)")
    return margin


def fused_or_unfused(key: tuple, unfused, fused, weight: torch.Tensor, rows: int,
                     has_bias: bool, candidates: list | None = None):
    """`fused(config)` with the config timed fastest for `key`, or `unfused()` where no config
    timed below `fused_margin()` of its time (1.0 unless PAGEDRT_FUSED_MARGIN says otherwise;
    timed once per key from a CUDA graph, outside capture; under capture an
    untimed key runs `unfused()`). Both callables must compute the same thing: the layers
    pass the plain module chain as `unfused` (pagedrt/models/layers.py). The candidates are
    the config `linear` chose for the same `weight` at `rows` rows and FUSED_DEFAULT (and
    FUSED_ONE_ROW at one row, and `wide_k_configs`): each one is a Triton compilation at
    start-up;
    `candidates`, where given, replaces them (a kernel with a config of another form)."""
    if key not in _FUSED_CHOICE:
        if torch.cuda.is_current_stream_capturing():
            return unfused()
        def configs():  # read once the baseline has run: it makes linear's choice
            if candidates is not None:
                yield from candidates
                return
            plain = _CHOICE.get(_plain_key(weight, rows, has_bias))
            extra = FUSED_ONE_ROW if rows == 1 else ()
            wide = wide_k_configs(weight.shape[0], device_sms(weight))
            row = row_configs(weight.shape[1], rows) if ROW_ENABLED else []
            yield from dict.fromkeys(c for c in (plain, FUSED_DEFAULT, *extra, *wide, *row)
                                     if c is not None)

        _FUSED_CHOICE[key] = fastest_config(unfused, fused, configs(), rep=10,
                                            record=(_FUSED_CHOICE, key, rows),
                                            baseline_margin=fused_margin())
    cfg = _FUSED_CHOICE[key]
    note_use(_FUSED_CHOICE, key)
    return unfused() if cfg is None else fused(cfg)
