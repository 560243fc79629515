"""Tiled matmul y = x @ W.T (+ bias) for the decode batches of 8 to 128 rows (issue 16).

At these row counts a decoder's linear layers are short GEMMs (Qwen2-0.5B: K = 896 for three
of its four) where cuBLAS reaches a fraction of the H200's bandwidth (docs/design.md, "Decode
matmuls (8 to 128 rows)", with what this kernel measured against it). It launches with
programmatic dependent launch like the decode step's other Triton kernels
(pagedrt/ops/triton_utils.py).

Tiles: each program owns BLOCK_M x BLOCK_N outputs; programs that share weight columns are
adjacent in launch order (the M tiles are the inner index), so a weight tile is read from
DRAM once and from L2 by the other row tiles. With `swap_ab` the product is taken as
(W x^T)^T: the weight tile is the MMA's left operand, whose 64-row granularity on Hopper then
falls on the weight's N instead of on a few token rows.

Split-K (`split_k` > 1): a long K with few output tiles (a down projection: N = 896,
K = 4,864 on Qwen2-0.5B, 14 weight tiles of 64 columns, so 14 programs at 8 rows) leaves most
SMs idle, so split_k programs share a tile, each over its own run of BLOCK_K steps. Each
stores its fp32 partial, then counts in on an arrival counter of its tile (a CTA barrier, then
an acq_rel atomic at GPU scope); the one that arrives last sums the split_k partials in split
order (so the bits do not depend on which one that is), adds the bias, writes y and sets the
counter back to 0. No program waits for another. The scheme and its persistent zeroed counters
are pagedrt/ops/arrival_counters.py's, whose module doc gives the memory-ordering argument
(launches on one stream never overlap on them: under PDL a kernel touches nothing before the
kernel ahead of it has finished). The
partials are a [split_k, M, N] fp32 tensor allocated per call (from the graph's pool when
captured).

SwiGLU's activation (`silu_mul`): for a gate/up weight [2I, K] a program loads the gate rows of
its tile and the up rows I further on, keeps two accumulators and writes silu(gate) * up,
rounded as the plain path rounds, so the [M, 2I] product is never written and the activation
kernel never launched (`linear_silu_mul`, for `MergedColumnParallelLinear.silu_mul_of`).

`linear` picks, once per (weight shape, rows, dtype, bias), the fastest of `CONFIGS` against
cuBLAS, timed from CUDA graphs outside graph capture, as the skinny matmul of 1-4 rows does
(pagedrt/ops/gemv_triton.py). Only the decode graphs' usual bucket sizes (8 and the multiples
of 16 up to 128: `row_count_timed`; not a `max_num_seqs` bucket of another size) are timed,
and only inside `timing()`, which the CUDA-graph runner holds while it warms up and captures
the graphs at start-up; a shape not timed then (another row count, an engine without graphs)
takes cuBLAS, so no step of a running engine stops to time. Past 128 rows cuBLAS: there the
kernel lost on every projection but the smallest, and the start-up timing (hot weights, 5%
margin) once chose it where the tuning with cold weights had it slower (at 160 rows).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from pagedrt.env_flags import env_flag
from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.config_timing import fastest_config, key_shape_index, note_use
from pagedrt.ops.triton_utils import (
    interpreting,
    pdl_enabled,
    pdl_launch,
    pdl_prologue,
)

ENABLED = env_flag("PAGEDRT_MATMUL")  # PAGEDRT_MATMUL=0: always cuBLAS
MIN_ROWS, MAX_ROWS = 8, 128


def fused_max_rows(value: str | None) -> int:
    """PAGEDRT_MATMUL_FUSED_MAX_ROWS: the most rows the fused ops (SwiGLU and RoPE in a
    projection's kernel) are timed and run at, a multiple of 16 from 128 (the default,
    the plain projection's MAX_ROWS) to 256.

    Raises:
        ValueError: anything else, naming the value.
    """
    if value is None or value.strip() == "":
        return MAX_ROWS
    v = value.strip()
    if not (v.isascii() and v.isdigit()) or int(v) % 16 or not MAX_ROWS <= int(v) <= 256:
        raise ValueError(f"PAGEDRT_MATMUL_FUSED_MAX_ROWS={value!r}: give a multiple of 16 "
                         f"from {MAX_ROWS} to 256 (decode rows up to which the fused ops run)")
    return int(v)


# PAGEDRT_MATMUL_FUSED_MAX_ROWS=256 (opt-in): the fused ops also at the decode graphs'
# 144-256-row buckets, where the plain projection stays on cuBLAS; at 256 rows the norm,
# SwiGLU and RoPE kernels beside cuBLAS took 232 us of a 2.09 ms step on an H100, but with
# the switch 256 x 512/128 ran at 0.99x of the default there (benchmarks/results/RUNS.md,
# "Runs of 2026-12-05 (21:40-22:15 UTC)")
FUSED_MAX_ROWS = fused_max_rows(os.environ.get("PAGEDRT_MATMUL_FUSED_MAX_ROWS"))


def row_count_timed(m: int, fused: bool = False) -> bool:
    """Whether `m` rows are a decode-graph bucket size this path times (8 and the multiples
    of 16 up to MAX_ROWS, 128, or for the fused ops FUSED_MAX_ROWS; `graph_batch_sizes` in
    pagedrt/engine/cuda_graphs.py, less a `max_num_seqs` of another size)."""
    upper = FUSED_MAX_ROWS if fused else MAX_ROWS
    return MIN_ROWS <= m <= upper and (m == 8 or m % 16 == 0)


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, swap_ab[, split_k]): the candidates timed
# per shape (benchmarks/matmul_tune.py on the H200, configs checked against F.linear and timed
# with cold weights: the whole-K tiles won on Qwen2-0.5B's QKV, O and gate/up projections, the
# split-K ones on the down projections (K = 4,864 and 14,336) and on Llama-3-8B's O at 8 rows;
# benchmarks/results/RUNS.md, "Runs of 2026-12-03 (23:05-01:00 UTC)" and "Runs of 2026-12-04
# (03:30-04:00 UTC)"). The four whole-K tiles of 16 weight rows are narrow: under wgmma's
# 64, so mma.sync on 1-4 warps, with four times the programs of a 64-row tile; on an H100 they
# beat the 64-row tiles at 8-32 rows on O (2.96-3.05 against 3.16-3.26 us) and on gate/up with
# the activation (7.8-8.3 against 8.8-9.1; `matmul_tune.py --grid narrow`, benchmarks/results/
# RUNS.md, "Runs of 2026-12-06 (23:03-00:45 UTC)"); in a whole step the 8-row decode graph took
# 0.948 of the time without them on an H100 and the 32-row one 1.008 (docs/design.md, "Decode
# matmuls (8 to 128 rows)")
CONFIGS = [
    (16, 64, 128, 4, 5, True),
    (32, 64, 128, 4, 5, True),
    (64, 64, 64, 4, 5, True),
    (16, 128, 64, 4, 5, True),
    (16, 16, 256, 4, 4, True),
    (16, 16, 256, 2, 4, True),
    (16, 16, 128, 1, 4, True),
    (32, 16, 128, 2, 3, True),
    (16, 64, 128, 4, 4, True, 8),
    (16, 64, 128, 4, 4, True, 4),
    (32, 64, 128, 4, 4, True, 4),
    (64, 64, 128, 4, 4, True, 2),
]
# gate/up with SwiGLU's activation (silu_mul) times the whole-K configs of CONFIGS: with them
# the H200's Qwen2-0.5B decode graphs took 0.82-0.85x of the cuBLAS graphs' time at 8-64 rows;
# with the tiles matmul_tune.py --grid silu timed fastest alone, 0.84-0.91x
# (benchmarks/results/RUNS.md, "Runs of 2026-12-04 (03:30-04:00 UTC)")
SILU_CONFIGS = [c for c in CONFIGS if len(c) == 6 or c[6] == 1]


@triton.jit
def _matmul_kernel(
    x_ptr,  # [M, K], last dim contiguous
    w_ptr,  # [N, K], K contiguous
    b_ptr,  # [N], read only when HAS_BIAS
    y_ptr,  # [M, N], N contiguous
    part_ptr,  # [SPLIT_K, M, N] fp32 partial products, used when SPLIT_K > 1
    counters_ptr,  # int32, one arrival counter per output tile, all 0, used when SPLIT_K > 1
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,  # programs per output tile, each over its own range of K
    SILU_MUL: tl.constexpr,  # w is [2N, K] = [gate | up]: y = silu(x @ gate.T) * (x @ up.T)
    SWAP_AB: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K
    IEEE: tl.constexpr,  # fp32 operands: exact products (no TF32), as F.linear by default
    UPCAST: tl.constexpr,  # bf16 under the interpreter, whose bf16 tl.dot is wrong: fp32 dot
    PDL: tl.constexpr = False,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_pid_m  # row tiles inner: the programs of one weight tile are adjacent
    pid_k = (pid // num_pid_m) % SPLIT_K
    pid_n = pid // (num_pid_m * SPLIT_K)
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K  # whole BLOCK_K steps
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)  # empty for a split past K: partial of 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    pdl_prologue(PDL)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    # [BLOCK_M, BLOCK_N] each; acc_up: the up half's product, SILU_MUL only
    out, acc_up = _tile_products(x_rows, w_rows, w_rows + N * stride_wn, mask_m, mask_n,
                                 k_begin, k_end, K, BLOCK_M, BLOCK_N, BLOCK_K, SILU_MUL,
                                 SWAP_AB, EVEN_K, IEEE, UPCAST)
    if SILU_MUL:
        # rounded as the plain path rounds: gate/up's output in y's dtype, then the SiLU
        # kernel's silu(gate) rounded before the product (fused_triton._silu_and_mul_kernel)
        dtype = y_ptr.dtype.element_ty
        gate = out.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        out = act * acc_up.to(dtype).to(tl.float32)
    mask_mn = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K > 1:
        # store this split's partial, count in; the tile's last program to arrive sums all
        # SPLIT_K partials in split order (the same sum whoever is last) and writes y
        # (the ordering argument is the fused decode reduce's: attention_triton's docstring)
        parts = part_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(parts + pid_k.to(tl.int64) * M * N, out, mask=mask_mn)
        tl.debug_barrier()
        counter = counters_ptr + pid_n * num_pid_m + pid_m
        count = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if count == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(parts + s * M * N, mask=mask_mn, other=0.0,
                                 cache_modifier=".cg")
            _store_tile(total, b_ptr, y_ptr, offs_m, offs_n, mask_n, mask_mn, stride_ym,
                        HAS_BIAS)
            tl.store(counter, 0)  # ready for the next launch (and graph replay)
    else:
        _store_tile(out, b_ptr, y_ptr, offs_m, offs_n, mask_n, mask_mn, stride_ym, HAS_BIAS)


@triton.jit
def _tile_products(x_rows, w_rows, w_rows2, mask_m, mask_n, k_begin, k_end, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   TWO: tl.constexpr, SWAP_AB: tl.constexpr, EVEN_K: tl.constexpr,
                   IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """(x @ W.T, x @ W2.T) over K in [k_begin, k_end), each [BLOCK_M, BLOCK_N] fp32: x's rows at
    `x_rows` ([BLOCK_M, 1] pointers), W's at `w_rows` and, with TWO, a second row set's at
    `w_rows2` ([BLOCK_N, 1] each; without TWO the second is zeros, unused). The K loop of
    `_matmul_kernel` and of the QKV + RoPE kernel (pagedrt/ops/matmul_rope_triton.py)."""
    offs_k = tl.arange(0, BLOCK_K)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = acc
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + offs_k
        if EVEN_K:
            mask_x = mask_m[:, None]
            mask_w = mask_n[:, None]
        else:
            mask_x = mask_m[:, None] & (kk < K)[None, :]
            mask_w = mask_n[:, None] & (kk < K)[None, :]
        a = tl.load(x_rows + kk[None, :], mask=mask_x, other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=mask_w, other=0.0)
        acc = _mma(a, w, acc, SWAP_AB, IEEE, UPCAST)
        if TWO:
            w2 = tl.load(w_rows2 + kk[None, :], mask=mask_w, other=0.0)
            acc2 = _mma(a, w2, acc2, SWAP_AB, IEEE, UPCAST)
    if SWAP_AB:
        acc = tl.trans(acc)
        acc2 = tl.trans(acc2)
    return acc, acc2


@triton.jit
def _mma(a, w, acc, SWAP_AB: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ w.T for a [BLOCK_M, BLOCK_K], w [BLOCK_N, BLOCK_K]; with SWAP_AB acc is
    [BLOCK_N, BLOCK_M] and gets w @ a.T. UPCAST: both operands to fp32 first (bf16 under the
    interpreter)."""
    if UPCAST:
        a = a.to(tl.float32)
        w = w.to(tl.float32)
    if SWAP_AB:
        if IEEE:
            acc = tl.dot(w, tl.trans(a), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(a), acc)
    else:
        if IEEE:
            acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _store_tile(out, b_ptr, y_ptr, offs_m, offs_n, mask_n, mask_mn, stride_ym,
                HAS_BIAS: tl.constexpr):
    """y[offs_m, offs_n] = out (+ bias), in y's dtype."""
    if HAS_BIAS:
        out += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=mask_mn)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} do not "
                         "multiply (x is [M, K] for a [N, K] weight)")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"x is {x.dtype} on {x.device}, weight {weight.dtype} on "
                         f"{weight.device}; they must match")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {x.dtype}: float16, bfloat16 or float32 only")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError("x's last dim and weight must be contiguous")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1
                             or bias.dtype != x.dtype or bias.device != x.device):
        raise ValueError(f"bias is {bias.dtype} {tuple(bias.shape)} (stride "
                         f"{bias.stride()}) on {bias.device}; expected a contiguous "
                         f"({weight.shape[0]},) {x.dtype} on {x.device}")


def matmul_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: tuple = CONFIGS[0], silu_mul: bool = False) -> torch.Tensor:
    """y = x @ weight.T (+ bias) in one kernel; with `silu_mul`, SwiGLU's activation of it.

    Args:
        x: [M, K], any M >= 0, last dim contiguous; fp16, bf16 or fp32 (fp32 products exact,
            not TF32; bf16 under the interpreter is multiplied in fp32, since its bf16 dot is
            wrong).
        weight: [N, K] contiguous, x's dtype and device. bias: [N] contiguous, x's dtype
            and device, or None.
        config: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, swap_ab[, split_k]),
            `CONFIGS`' form; the blocks powers of two, at least 16; split_k (default 1) >= 1
            programs per output tile, each over 1/split_k of K's BLOCK_K steps, the last to
            finish summing the fp32 partials in split order (deterministic).
        silu_mul: weight is [2 * N, K], gate's rows then up's (a gate/up projection), and y is
            silu(x @ gate.T) * (x @ up.T), each product rounded to x's dtype before the
            activation, and silu(gate) before the product, as the plain path rounds
            (`silu_and_mul_triton` after the matmul). No bias, split_k 1.
    Returns:
        [M, N] in x's dtype, fp32 accumulation.
    Raises:
        ValueError: shapes, dtypes or devices that do not match, a config out of form, a bias
            or split_k > 1 or an odd number of weight rows with silu_mul.
    """
    _check(x, weight, bias)
    if len(config) not in (6, 7):
        raise ValueError(f"config {config}: expected (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, "
                         "num_stages, swap_ab[, split_k])")
    block_m, block_n, block_k, num_warps, num_stages, swap_ab = config[:6]
    split_k = config[6] if len(config) == 7 else 1
    for name, b in (("BLOCK_M", block_m), ("BLOCK_N", block_n), ("BLOCK_K", block_k)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"config {config}: {name} = {b} must be a power of two >= 16")
    if not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"config {config}: split_k = {split_k!r} must be an int >= 1")
    m, (n, k) = x.shape[0], weight.shape
    if silu_mul:
        if bias is not None or split_k != 1 or n % 2:
            raise ValueError(f"silu_mul: weight {tuple(weight.shape)}, bias "
                             f"{'given' if bias is not None else 'None'}, split_k {split_k}; "
                             "it needs an even number of weight rows (gate | up), no bias "
                             "and split_k 1")
        n //= 2
    upcast = x.dtype == torch.bfloat16 and interpreting(x)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    if split_k > 1 and split_k * m * n >= 2**31:
        raise ValueError(f"split_k {split_k} x {m} x {n} partials exceed the kernel's int32 "
                         "offsets; use split_k 1")
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    if split_k > 1:
        parts = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        counters = arrival_counters(x.device, tiles)
    else:
        parts = counters = y  # not read
    _matmul_kernel[(tiles * split_k,)](
        x, weight, bias if bias is not None else weight, y, parts, counters, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, SILU_MUL=silu_mul, SWAP_AB=bool(swap_ab), EVEN_K=k % block_k == 0,
        IEEE=x.dtype == torch.float32 or upcast, UPCAST=upcast, num_warps=num_warps,
        num_stages=num_stages, **pdl_launch(pdl_enabled(x)),
    )
    return y


_CHOICE: dict[tuple, tuple | None] = {}  # key -> config; None = the torch path
_TIMING = False  # inside `timing()`


@contextlib.contextmanager
def timing():
    """While held, the first call of an untimed shape (outside stream capture) times it; the
    CUDA-graph runner holds it around the warm-up and capture of the decode graphs
    (pagedrt/engine/cuda_graphs.py). Elsewhere an untimed shape takes cuBLAS."""
    global _TIMING
    previous, _TIMING = _TIMING, True
    try:
        yield
    finally:
        _TIMING = previous


def _eligible(x: torch.Tensor, weight: torch.Tensor, fused: bool = False) -> bool:
    """Whether x [M, K] and weight [N, K] may take this path: the path on (`ENABLED`), fp16 or
    bf16 CUDA tensors of one dtype, x's last dim and the weight contiguous, at a timed row
    count (`row_count_timed`; fused: a fused op's)."""
    return (ENABLED and x.is_cuda and x.dim() == 2 and x.stride(-1) == 1
            and weight.is_contiguous() and x.dtype in (torch.float16, torch.bfloat16)
            and x.dtype == weight.dtype and row_count_timed(x.shape[0], fused))


def _choice(key: tuple, baseline, candidate, configs: list = CONFIGS) -> tuple | None:
    """The config of `configs` timed fastest for `key` against `baseline` (None: the
    baseline), timed on the first call inside `timing()` outside graph capture; elsewhere an
    untimed key takes the baseline. Every key holds the weight's shape and then the row count
    (`_key_rows`)."""
    if key not in _CHOICE:
        if not _TIMING or torch.cuda.is_current_stream_capturing():
            return None
        _CHOICE[key] = fastest_config(baseline, candidate, configs, rep=10,
                                      record=(_CHOICE, key, _key_rows(key)))
    note_use(_CHOICE, key)
    return _CHOICE[key]


def _key_rows(key: tuple) -> int:
    """The row count of a `_CHOICE` key: the int right after the weight's shape, in every
    key's layout ((shape, rows, ...) and (op name, shape, rows, ...)); 0 for a key without."""
    i = key_shape_index(key)
    if i is None or i + 1 >= len(key) or not isinstance(key[i + 1], int):
        return 0
    return int(key[i + 1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through `matmul_triton` where that was timed faster (16-bit
    CUDA tensors at the row counts of `row_count_timed`); x [M, K], weight [N, K]."""
    if not _eligible(x, weight):
        return F.linear(x, weight, bias)
    key = (weight.shape, x.shape[0], weight.dtype, bias is not None, weight.device.index)
    cfg = _choice(key, lambda: F.linear(x, weight, bias),
                  lambda c: matmul_triton(x, weight, bias, c))
    return F.linear(x, weight, bias) if cfg is None else matmul_triton(x, weight, bias, cfg)


def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor, baseline) -> torch.Tensor:
    """SwiGLU's silu(x @ gate.T) * (x @ up.T) for a gate/up weight [2 * I, K] (gate's rows,
    then up's): `matmul_triton(..., silu_mul=True)`, one kernel, where that was timed faster
    than `baseline()`, the plain path that computes the same (the gate/up matmul, then the
    activation kernel); else `baseline()`. Candidates: `SILU_CONFIGS`. Returns [M, I].
    (Past MAX_ROWS rows, at prefill sizes, the fused kernel was slower than cuBLAS and the
    activation at every tile tried: docs/design.md, "Prefill by parts".)"""
    if not _eligible(x, weight, fused=True) or weight.shape[0] % 2:
        return baseline()
    key = ("silu_mul", weight.shape, x.shape[0], weight.dtype, weight.device.index)
    cfg = _choice(key, baseline, lambda c: matmul_triton(x, weight, None, c, silu_mul=True),
                  SILU_CONFIGS)
    return baseline() if cfg is None else matmul_triton(x, weight, None, cfg, silu_mul=True)

