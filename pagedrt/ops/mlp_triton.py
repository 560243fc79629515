"""The whole SwiGLU MLP of 1 to 4 decode rows in one kernel: the residual add and RMSNorm,
gate/up, silu(gate) * up and the down projection (issue 16: a batch-1 step is bound by
launches; this one kernel replaces the two of the fused chain, `gemv_rmsnorm_triton` over
gate/up and `gemv_silu_mul_triton` over down, in pagedrt/ops/gemv_triton.py).

The intermediate dimension I is cut into BLOCK_I columns per program. Program c computes its
columns' gate and up products over the whole hidden size H (weight rows c * BLOCK_I ... of
the gate half and of the up half, each read once, as the skinny matmul reads them, with its
RMSNorm prologue), the activation h = silu(gate) * up of those columns, and h's share of the
down projection: h [M, BLOCK_I] times the down weight's columns c * BLOCK_I ... for all H
outputs (each down weight column read once, by this program). That is a split-K of the down
projection over the programs, so each program stores an fp32 partial [M, H], and the partials
are summed with arrival counters (pagedrt/ops/arrival_counters.py), in two levels so that no
program reads them all: the programs come in groups of GROUP; the last of a group to arrive
sums its group's partials into a group sum and counts in once more, at the top; the last
group to arrive there sums the group sums and writes y. Each sum is one reduction tree of
fixed shape over fixed entries (`_sum_entries`), the same whoever arrives last, so the
result does not depend on the order the programs ran.

The first tiles of the gate/up and down weights are loaded before the PDL wait
(`pdl_prologue`): they are no kernel's output. That is gate/up's first PRE_K columns
(`pre_wait_columns`' budget of values per thread) or, with `ahead`, its first loop step's
tiles instead, and the first down tile on top of either. Rounding follows the unfused modules: gate and
up rounded to the model dtype (the gate/up matmul's output), silu(gate) rounded, the product
rounded (pagedrt/models/layers.py's SiluAndMul), the down sum in fp32 rounded once.

Chosen per shape by timing against the chain (`gemv_triton.fused_or_unfused`); opt-in
(PAGEDRT_FUSED_MLP=1) until measured on a GPU; not under tensor parallelism, nor with biases.
docs/design.md, "Small-batch decode".
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pagedrt.env_flags import env_flag
from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.gemv_triton import (
    MAX_ROWS,
    _input_chunk,
    _rows_products,
    _rows_rstd,
    pre_wait_columns,
    rstd_block,
)
from pagedrt.ops.triton_utils import pdl_enabled, pdl_launch, pdl_prologue

ENABLED = env_flag("PAGEDRT_FUSED_MLP")  # PAGEDRT_FUSED_MLP=1: on (off by default)
# (BLOCK_I, BLOCK_K, BLOCK_H, num_warps, ahead): intermediate columns per program, hidden
# columns per gate/up loop step, down weight rows per down loop step, warps, and whether each
# loop loads its next step's weight tiles before the current step's products (two steps'
# loads in flight per program, for twice the registers). A gate/up step reads 16-32 KB of
# bf16 weights per program (gate and up), a down step 8-16 KB; 16-64 columns per program
# give 76-304 programs at Qwen2-0.5B's I = 4,864
CONFIGS = [(16, 256, 256, 4, 0), (32, 128, 128, 4, 0), (32, 256, 128, 8, 0),
           (64, 128, 64, 8, 0), (16, 512, 512, 8, 0), (16, 256, 256, 4, 1),
           (32, 128, 128, 4, 1), (32, 128, 256, 8, 1)]
SUM_VALUES = 8192  # fp32 values per load while summing partials: 64 a thread at 4 warps, 32 at 8


@triton.jit
def _sum_entries(src_ptr, first, count, dst_ptr, H, M: tl.constexpr, ENTRIES: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    """dst [M, H] (its dtype) = the sum of the `count` (<= ENTRIES) [M, H] fp32 entries of
    src from entry `first` on, in one tree over the entries per column (a fixed order: the
    same sum in every run); read with .cg, from L2, where other programs stored them."""
    offs_j = tl.arange(0, ENTRIES)
    mask_j = offs_j < count
    entries = (first + offs_j).to(tl.int64)[:, None] * (M * H)
    offs_r0 = tl.arange(0, BLOCK_R)
    for m in tl.static_range(M):
        for n0 in range(0, H, BLOCK_R):
            offs_r = n0 + offs_r0
            mask_r = offs_r < H
            vals = tl.load(src_ptr + entries + m * H + offs_r[None, :],
                           mask=mask_j[:, None] & mask_r[None, :], other=0.0,
                           cache_modifier=".cg")
            total = tl.sum(vals, axis=0)
            tl.store(dst_ptr + m * H + offs_r, total.to(dst_ptr.dtype.element_ty),
                     mask=mask_r)


@triton.jit
def _gate_up_tiles(gate_rows, up_rows, mask_i, offs_k, H):
    """The gate and up weight tiles [BLOCK_I, len(offs_k)] at hidden columns offs_k (0 past
    H or past I's rows)."""
    mask = mask_i[:, None] & (offs_k < H)[None, :]
    return (tl.load(gate_rows + offs_k[None, :], mask=mask, other=0.0),
            tl.load(up_rows + offs_k[None, :], mask=mask, other=0.0))


@triton.jit
def _down_tile(down_cols, mask_i, offs_n, H, I):
    """The down weight's tile [len(offs_n), BLOCK_I] at output rows offs_n (0 past H or past
    I's columns)."""
    mask = (offs_n < H)[:, None] & mask_i[None, :]
    return tl.load(down_cols + offs_n.to(tl.int64)[:, None] * I, mask=mask, other=0.0)


@triton.jit
def _down_share(part, wd, h, offs_n, mask_n, offs_m, H, M: tl.constexpr):
    """Stores part[m, offs_n] = sum_i h[m, i] * wd[n, i] for the M rows: h [BLOCK_I] fp32 for
    one row, else [M_PAD, BLOCK_I]; wd [BLOCK_H, BLOCK_I], the down weight's rows offs_n at
    this program's columns."""
    wd = wd.to(tl.float32)
    if M == 1:
        tl.store(part + offs_n, tl.sum(wd * h[None, :], axis=1), mask=mask_n)
    else:
        for m in tl.static_range(M):
            h_m = tl.sum(tl.where(offs_m[:, None] == m, h, 0.0), axis=0)  # [BLOCK_I]
            tl.store(part + m * H + offs_n, tl.sum(wd * h_m[None, :], axis=1), mask=mask_n)


@triton.jit
def _mlp_kernel(
    x_ptr,  # [M, H]
    r_ptr,  # HAS_RESIDUAL: residual [M, H]
    nw_ptr,  # the RMSNorm weight [H]
    new_r_ptr,  # HAS_RESIDUAL: x + residual [M, H] contiguous, program 0 writes
    wgu_ptr,  # [2 * I, H] contiguous: gate rows, then up rows
    wd_ptr,  # [H, I] contiguous
    part_ptr,  # [num_programs, M, H] fp32 partials of the down projection
    gsum_ptr,  # [num_groups, M, H] fp32 group sums
    y_ptr,  # [M, H] contiguous
    counters_ptr,  # int32, num_groups + 1 arrival counters, all 0
    H, I, stride_xm, stride_rm, eps,
    M: tl.constexpr,
    M_PAD: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    GROUP: tl.constexpr,  # programs per group of the partials' sum
    NUM_GROUPS: tl.constexpr,
    GROUPS_PAD: tl.constexpr,  # NUM_GROUPS rounded up to a power of two
    SUM_BLOCK: tl.constexpr,  # columns per load while summing GROUP entries
    TOP_BLOCK: tl.constexpr,  # columns per load while summing GROUPS_PAD entries
    HAS_RESIDUAL: tl.constexpr,
    RSTD_BLOCK: tl.constexpr,  # `rstd_block(H)`
    PDL: tl.constexpr = False,
    PRE_K: tl.constexpr = 0,  # gate/up's first PRE_K columns loaded before the PDL wait
    AHEAD: tl.constexpr = False,  # each loop's weight tiles loaded a step ahead
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    offs_i = pid * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < I
    gate_rows = wgu_ptr + offs_i.to(tl.int64)[:, None] * H
    up_rows = wgu_ptr + (offs_i + I).to(tl.int64)[:, None] * H
    offs_n0 = tl.arange(0, BLOCK_H)
    down_cols = wd_ptr + offs_i[None, :]
    # the weights are no earlier kernel's output: their first tiles load while it runs
    wd_first = _down_tile(down_cols, mask_i, offs_n0, H, I)
    if PRE_K > 0:
        offs_pre = tl.arange(0, PRE_K)
        mask_pre = mask_i[:, None] & (offs_pre < H)[None, :]
        wg_pre = tl.load(gate_rows + offs_pre[None, :], mask=mask_pre, other=0.0)
        wu_pre = tl.load(up_rows + offs_pre[None, :], mask=mask_pre, other=0.0)
    if AHEAD:  # (the wrapper passes PRE_K 0 then: this is the pre-wait gate/up tile)
        wg_ahead, wu_ahead = _gate_up_tiles(gate_rows, up_rows, mask_i,
                                            PRE_K + tl.arange(0, BLOCK_K), H)
    pdl_prologue(PDL)
    offs_m = tl.arange(0, M_PAD)
    offs_k0 = tl.arange(0, BLOCK_K)
    rstd_m = _rows_rstd(x_ptr, r_ptr, new_r_ptr, stride_xm, stride_rm, H, eps, pid == 0,
                        M, M_PAD, RSTD_BLOCK, HAS_RESIDUAL)
    dt = wgu_ptr.dtype.element_ty
    if M == 1:  # one row: products kept per lane, reduced once at the end (as the gemv)
        rstd0 = tl.sum(tl.where(offs_m == 0, rstd_m, 0.0), axis=0)
        gate = tl.zeros((BLOCK_I,), dtype=tl.float32)
        up = tl.zeros((BLOCK_I,), dtype=tl.float32)
        acc_g = tl.zeros((BLOCK_I, BLOCK_K), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_I, BLOCK_K), dtype=tl.float32)
        if PRE_K > 0:
            x_pre = _input_chunk(x_ptr, r_ptr, nw_ptr, 0, stride_xm, stride_rm, offs_pre,
                                 offs_pre < H, rstd0, H, 1, HAS_RESIDUAL)
            gate = tl.sum(wg_pre.to(tl.float32) * x_pre[None, :], axis=1)
            up = tl.sum(wu_pre.to(tl.float32) * x_pre[None, :], axis=1)
    else:
        gate = tl.zeros((M_PAD, BLOCK_I), dtype=tl.float32)
        up = tl.zeros((M_PAD, BLOCK_I), dtype=tl.float32)
        if PRE_K > 0:
            gate = _rows_products(gate, wg_pre.to(tl.float32), x_ptr, r_ptr, nw_ptr,
                                  stride_xm, stride_rm, offs_pre, offs_pre < H, rstd_m, H,
                                  offs_m, M, 1, HAS_RESIDUAL)
            up = _rows_products(up, wu_pre.to(tl.float32), x_ptr, r_ptr, nw_ptr, stride_xm,
                                stride_rm, offs_pre, offs_pre < H, rstd_m, H, offs_m, M, 1,
                                HAS_RESIDUAL)
    for k0 in range(PRE_K, H, BLOCK_K):
        offs_k = k0 + offs_k0
        mask_k = offs_k < H
        if AHEAD:  # each step's tiles loaded one step ahead, the first before the wait
            wg, wu = wg_ahead, wu_ahead
            wg_ahead, wu_ahead = _gate_up_tiles(gate_rows, up_rows, mask_i, offs_k + BLOCK_K,
                                                H)
        else:
            wg, wu = _gate_up_tiles(gate_rows, up_rows, mask_i, offs_k, H)
        if M == 1:
            x = _input_chunk(x_ptr, r_ptr, nw_ptr, 0, stride_xm, stride_rm, offs_k, mask_k,
                             rstd0, H, 1, HAS_RESIDUAL)
            acc_g += wg.to(tl.float32) * x[None, :]
            acc_u += wu.to(tl.float32) * x[None, :]
        else:
            gate = _rows_products(gate, wg.to(tl.float32), x_ptr, r_ptr, nw_ptr, stride_xm,
                                  stride_rm, offs_k, mask_k, rstd_m, H, offs_m, M, 1,
                                  HAS_RESIDUAL)
            up = _rows_products(up, wu.to(tl.float32), x_ptr, r_ptr, nw_ptr, stride_xm,
                                stride_rm, offs_k, mask_k, rstd_m, H, offs_m, M, 1,
                                HAS_RESIDUAL)
    if M == 1:
        gate += tl.sum(acc_g, axis=1)
        up += tl.sum(acc_u, axis=1)
    # rounded as the chain rounds: gate/up's output, silu(gate), the product
    gate = gate.to(dt).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
    h = (act * up.to(dt).to(tl.float32)).to(dt).to(tl.float32)  # [BLOCK_I] or [M_PAD, BLOCK_I]
    # h's share of the down projection, all H outputs, into this program's partial
    part = part_ptr + pid.to(tl.int64) * M * H
    if AHEAD:  # each step's tile loaded one step ahead
        wd_ahead = wd_first
        for n0 in range(0, H, BLOCK_H):
            offs_n = n0 + offs_n0
            wd_next = _down_tile(down_cols, mask_i, offs_n + BLOCK_H, H, I)
            _down_share(part, wd_ahead, h, offs_n, offs_n < H, offs_m, H, M)
            wd_ahead = wd_next
    else:
        _down_share(part, wd_first, h, offs_n0, offs_n0 < H, offs_m, H, M)
        for n0 in range(BLOCK_H, H, BLOCK_H):
            offs_n = n0 + offs_n0
            _down_share(part, _down_tile(down_cols, mask_i, offs_n, H, I), h, offs_n,
                        offs_n < H, offs_m, H, M)
    # count in: the last of the group sums its partials; the last group sums the groups
    # (a CTA barrier first puts every thread's stores before the acq_rel atomic:
    # pagedrt/ops/arrival_counters.py)
    tl.debug_barrier()
    group = pid // GROUP
    first = group * GROUP
    members = tl.minimum(GROUP, num_programs - first)
    count = tl.atomic_add(counters_ptr + group, 1, sem="acq_rel", scope="gpu")
    if count == members - 1:
        _sum_entries(part_ptr, first, members, gsum_ptr + group.to(tl.int64) * M * H, H, M,
                     GROUP, SUM_BLOCK)
        tl.store(counters_ptr + group, 0)  # ready for the next launch (and graph replay)
        tl.debug_barrier()
        top = tl.atomic_add(counters_ptr + NUM_GROUPS, 1, sem="acq_rel", scope="gpu")
        if top == NUM_GROUPS - 1:
            _sum_entries(gsum_ptr, 0, NUM_GROUPS, y_ptr, H, M, GROUPS_PAD, TOP_BLOCK)
            tl.store(counters_ptr + NUM_GROUPS, 0)


def groups_of(num_programs: int) -> tuple[int, int]:
    """(GROUP, NUM_GROUPS) for the partials' two-level sum over `num_programs` programs: GROUP
    a power of two near the square root of the program count, so that the last program of a
    group and the last group each read about sqrt(num_programs) partials."""
    group = 1 << max(0, math.ceil(math.log2(max(1, math.isqrt(num_programs)))))
    return group, triton.cdiv(num_programs, group)


def _check(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
           gate_up_weight: torch.Tensor, down_weight: torch.Tensor) -> None:
    """ValueError naming what does not fit: x [M, H] with M in 1..MAX_ROWS and its last dim
    contiguous; residual None or like x; norm_weight [H]; gate_up_weight [2I, H] and
    down_weight [H, I] contiguous; one dtype and device throughout."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or x.stride(1) != 1:
        raise ValueError(f"x {tuple(x.shape)} must be [M, H] with M in 1..{MAX_ROWS} and its "
                         "last dim contiguous")
    h = x.shape[1]
    if gate_up_weight.dim() != 2 or gate_up_weight.shape[1] != h or gate_up_weight.shape[0] % 2:
        raise ValueError(f"gate_up_weight {tuple(gate_up_weight.shape)} must be [2I, H] for x "
                         f"{tuple(x.shape)}")
    inter = gate_up_weight.shape[0] // 2
    if down_weight.shape != (h, inter):
        raise ValueError(f"down_weight {tuple(down_weight.shape)} must be [H, I] = ({h}, "
                         f"{inter}) for gate_up_weight {tuple(gate_up_weight.shape)}")
    if norm_weight.shape != (h,) or norm_weight.stride(0) != 1:
        raise ValueError(f"norm_weight {tuple(norm_weight.shape)} must be ({h},), contiguous")
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1):
        raise ValueError(f"residual {tuple(residual.shape)} must be like x {tuple(x.shape)}, "
                         "last dim contiguous")
    for name, t in (("residual", residual), ("norm_weight", norm_weight),
                    ("gate_up_weight", gate_up_weight), ("down_weight", down_weight)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name} is {t.dtype} on {t.device}, x {x.dtype} on {x.device}; "
                             "they must match")
    if not (gate_up_weight.is_contiguous() and down_weight.is_contiguous()):
        raise ValueError("gate_up_weight and down_weight must be contiguous")


def mlp_triton(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
               eps: float, gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
               config: tuple[int, int, int, int, int] = (32, 128, 128, 4, 0),
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`down(silu(gate) * up)` of `gate_up(RMSNorm(x + residual))` in one kernel: the decoder
    MLP of pagedrt/models/llama.py for 1 to MAX_ROWS rows, rounded where its modules round
    (module doc).

    Args:
        x: [M, H], M in 1..MAX_ROWS, last dim contiguous; fp16, bf16 or fp32.
        residual: None or [M, H] like x (last dim contiguous).
        norm_weight: [H]; eps: the norm's epsilon.
        gate_up_weight: [2I, H] contiguous, gate rows then up rows (no bias).
        down_weight: [H, I] contiguous (no bias).
        config: (BLOCK_I, BLOCK_K, BLOCK_H, num_warps, ahead), `CONFIGS`.
        All tensors share x's dtype and device.
    Returns:
        (y [M, H] in x's dtype, new_residual [M, H] = x + residual, or None without residual).
    Raises:
        ValueError: shapes, dtypes or devices that do not fit (`_check`).
    """
    _check(x, residual, norm_weight, gate_up_weight, down_weight)
    m, h = x.shape
    inter = down_weight.shape[1]
    block_i, block_k, block_h, num_warps, ahead = config
    programs = triton.cdiv(inter, block_i)
    group, num_groups = groups_of(programs)
    groups_pad = triton.next_power_of_2(num_groups)
    y = torch.empty((m, h), dtype=x.dtype, device=x.device)
    part = torch.empty((programs, m, h), dtype=torch.float32, device=x.device)
    gsum = torch.empty((num_groups, m, h), dtype=torch.float32, device=x.device)
    new_residual = (torch.empty_like(x, memory_format=torch.contiguous_format)
                    if residual is not None else None)
    counters = arrival_counters(x.device, num_groups + 1)
    _mlp_kernel[(programs,)](
        x, residual if residual is not None else x, norm_weight,
        new_residual if new_residual is not None else x, gate_up_weight, down_weight, part,
        gsum, y, counters, h, inter, x.stride(0),
        residual.stride(0) if residual is not None else 0, eps,
        M=m, M_PAD=max(2, triton.next_power_of_2(m)), BLOCK_I=block_i, BLOCK_K=block_k,
        BLOCK_H=min(block_h, triton.next_power_of_2(h)), GROUP=group, NUM_GROUPS=num_groups,
        GROUPS_PAD=groups_pad,
        SUM_BLOCK=min(triton.next_power_of_2(h), max(16, SUM_VALUES // group)),
        TOP_BLOCK=min(triton.next_power_of_2(h), max(16, SUM_VALUES // groups_pad)),
        HAS_RESIDUAL=residual is not None, RSTD_BLOCK=rstd_block(h),
        PRE_K=0 if ahead else pre_wait_columns(2 * block_i, h, num_warps), AHEAD=bool(ahead),
        num_warps=num_warps,
        **pdl_launch(pdl_enabled(x)),
    )
    return y, new_residual
