"""Skinny matmul y = x @ W.T (+ bias) for a few rows of x: the decode of small batches.

At batch 1 to 4 a decoder's linear layers are matrix-vector products: the time is reading W
once, and cuBLAS's kernels for these shapes reach well under the device's bandwidth (on the
H200, Qwen2-0.5B's down projection ran at about 1.2 TB/s through a split-K GEMM plus a
reduction kernel). This kernel streams W once with wide loads, each program owning BLOCK_N
output columns for all M rows, fp32 accumulation, bias added in the epilogue.

`linear` picks, once per (N, K, M, dtype), the faster of this kernel (over a few tile
configs) and `torch.nn.functional.linear`, timed on the device outside CUDA-graph capture;
under capture, a shape not yet timed falls back to torch.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 4  # rows of x (tokens) this path serves
ENABLED = os.environ.get("PAGEDRT_GEMV", "1") != "0"  # PAGEDRT_GEMV=0: always torch

# (BLOCK_N, BLOCK_K, num_warps): tiles of W of 2-16 KB, read once each
CONFIGS = [(4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 256, 4), (16, 512, 8), (32, 128, 4),
           (32, 256, 8), (64, 128, 8)]


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K], K contiguous
    b_ptr,  # [N], read only when HAS_BIAS
    y_ptr,  # [M, N] contiguous
    N, K,
    stride_xm, stride_wn,
    M: tl.constexpr,
    M_PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k0 = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    if M == 1:
        # one row: keep the products per lane and reduce once at the end
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + offs_k0
            mask_k = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                        other=0.0)
            x = tl.load(x_ptr + offs_k, mask=mask_k, other=0.0)
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
        acc1 = tl.sum(acc2, axis=1)  # [BLOCK_N]
        if HAS_BIAS:
            acc1 += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, acc1.to(y_ptr.dtype.element_ty), mask=mask_n)
    else:
        offs_m = tl.arange(0, M_PAD)
        acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + offs_k0
            mask_k = offs_k < K
            w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                        other=0.0).to(tl.float32)
            for m in tl.static_range(M):
                x = tl.load(x_ptr + m * stride_xm + offs_k, mask=mask_k, other=0.0)
                part = tl.sum(w * x.to(tl.float32)[None, :], axis=1)  # [BLOCK_N]
                acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        y = y_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & mask_n[None, :])


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                config: tuple[int, int, int] = (8, 256, 4)) -> torch.Tensor:
    """y = x @ weight.T (+ bias) with the skinny kernel.

    Args:
        x: [M, K], M in 1..MAX_ROWS, last dim contiguous; fp16, bf16 or fp32.
        weight: [N, K], contiguous, same dtype and device.
        bias: [N] or None.
        config: (BLOCK_N, BLOCK_K, num_warps).
    Returns:
        [M, N] in x's dtype.
    Raises:
        ValueError: shapes, dtypes or devices that do not match.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply")
    m, k = x.shape
    n = weight.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"x has {m} rows; this kernel serves 1 to {MAX_ROWS}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"x is {x.dtype} on {x.device}, weight {weight.dtype} on "
                         f"{weight.device}; they must match")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError("x's last dim and weight must be contiguous")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; expected ({n},)")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, block_k, num_warps = config
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, n, k, x.stride(0), weight.stride(0),
        M=m, M_PAD=max(2, triton.next_power_of_2(m)), HAS_BIAS=bias is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )
    return y


_CHOICE: dict[tuple, tuple[int, int, int] | None] = {}  # shape key -> config, None = torch


def _choose(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple | None:
    """Time torch and every config on these shapes as the engine runs them: replayed from a
    CUDA graph (triton.testing.do_bench_cudagraph), where launch overhead does not hide the
    kernels' own time."""
    from triton.testing import do_bench_cudagraph

    def timed(fn) -> float:
        fn()  # compile outside the capture
        return do_bench_cudagraph(fn, rep=20)

    best, best_ms = None, timed(lambda: F.linear(x, weight, bias))
    for cfg in CONFIGS:
        try:
            ms = timed(lambda cfg=cfg: gemv_triton(x, weight, bias, cfg))
        except Exception:  # noqa: BLE001, S112 - a config this GPU cannot run is skipped
            continue
        if ms < 0.95 * best_ms:  # a clear win only
            best, best_ms = cfg, ms
    return best


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the skinny kernel where that was timed faster."""
    m = x.shape[0] if x.dim() == 2 else 0
    if not (ENABLED and x.is_cuda and 1 <= m <= MAX_ROWS and x.stride(-1) == 1
            and weight.is_contiguous()):
        return F.linear(x, weight, bias)
    key = (weight.shape, m, x.dtype, bias is not None, x.device.index)
    if key not in _CHOICE:
        if torch.cuda.is_current_stream_capturing():
            return F.linear(x, weight, bias)
        _CHOICE[key] = _choose(x, weight, bias)
    cfg = _CHOICE[key]
    return F.linear(x, weight, bias) if cfg is None else gemv_triton(x, weight, bias, cfg)
