"""Triton kernels for the small elementwise ops of the decoder: RMSNorm (with the residual add
fused in), RoPE (alone, or with the new K/V's cache write fused in) and SwiGLU's
silu(gate) * up.

In eager torch each of these is a chain of kernels with fp32 temporaries in between (RMSNorm
alone is upcast, square, mean, rsqrt, multiply, downcast, multiply by the weight); on a small
model that chain costs more than the matmuls around it. Here each op is one pass over memory.

They reproduce the rounding of the torch modules in `pagedrt.models.layers`, which stay the
CPU path and the oracle: every step torch does in the input dtype (the residual add, the cast
before the weight multiply, silu before the multiply by up) is rounded to that dtype here too,
while the arithmetic itself is fp32. No wrapper reads a device value on the host, so all of
them can be captured in a CUDA graph.

Each wrapper checks its arguments' contract (ValueError) unless called with `validate=False`,
which the model's layers pass for tensors they built themselves: the checks cost about as much
host time as the launch (measured on the H200's host: 31.6 us per RMSNorm call with them, 14.9
for the bare launch; `benchmarks/launch_overhead.py`), and a prefill step makes ~150 such calls.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.fp8 import is_fp8
from pagedrt.ops.fp8_triton import fp8_e4m3_value, fp8_quantize, fp8_row_scale
from pagedrt.ops.kv_write_triton import write_kv_triton
from pagedrt.ops.triton_utils import (
    SUPPORTED_DTYPES,
    check_index,
    check_same,
    next_pow2,
    pdl_enabled,
    pdl_launch,
    pdl_prologue,
    v_dim_major,
)

_MAX_HIDDEN = 32768  # one row per program: the whole row must fit one tile


def _check_device(device: torch.device, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}; expected {device} like the other inputs")


def _num_warps(block: int) -> int:
    """About 8 elements per thread, 1 to 16 warps."""
    return min(16, max(1, block // 256))


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [num_tokens, hidden]
    residual_ptr,  # [num_tokens, hidden], read only when HAS_RESIDUAL
    weight_ptr,  # [hidden]
    out_ptr,  # [num_tokens, hidden] contiguous
    new_residual_ptr,  # [num_tokens, hidden] contiguous, written only when HAS_RESIDUAL
    stride_x, stride_r,  # row strides of x and residual; the hidden dim has stride 1
    hidden,
    eps,
    BLOCK: tl.constexpr,  # hidden rounded up to a power of two
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (pdl_enabled)
):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # torch adds in x's dtype: an fp32 sum rounded once to that dtype
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * hidden + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    normed = (xf * rstd).to(x_ptr.dtype.element_ty)  # torch casts back before the weight
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    out = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * hidden + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of each row, optionally after adding the residual; same results as
    `layers.RMSNorm.forward` up to the order of the fp32 sum of squares.

    Args:
        x: [num_tokens, hidden] fp16/bf16/fp32, hidden dim contiguous (rows may be strided).
        weight: [hidden], any supported dtype, same device; the output dtype is
            `torch.promote_types(weight.dtype, x.dtype)`, as with torch's `weight * normed`.
        eps: added to the mean square before the rsqrt.
        residual: None, or like x (same shape, dtype and device).
        validate: check the above (ValueError); False skips the checks (see the module doc).

    Returns:
        out [num_tokens, hidden] without residual; with it `(out, new_residual)`, where
        `new_residual = x + residual` in x's dtype and `out = norm(new_residual)`.
        Both are new contiguous tensors; the inputs are not modified.
    """
    if validate:
        _check_device(x.device, weight=weight,
                      **({} if residual is None else {"residual": residual}))
        check_index("x", x, 2, SUPPORTED_DTYPES, x.device)
        if x.shape[1] > _MAX_HIDDEN:
            raise ValueError(
                f"hidden={x.shape[1]} > {_MAX_HIDDEN}: a row must fit one program's tile")
        check_index("weight", weight, 1, SUPPORTED_DTYPES, x.device)
        if weight.shape[0] != x.shape[1]:
            raise ValueError(f"weight has {weight.shape[0]} entries for hidden={x.shape[1]}")
        if residual is not None:
            check_same("x", x, "residual", residual)
            if residual.stride(-1) != 1:
                raise ValueError(
                    f"residual.stride(-1) is {residual.stride(-1)}; must be contiguous")
    num_tokens, hidden = x.shape
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    new_residual = None
    if residual is not None:
        new_residual = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens > 0:
        block = next_pow2(hidden)
        _rms_norm_kernel[(num_tokens,)](
            x, residual if residual is not None else x, weight, out,
            new_residual if new_residual is not None else out,
            x.stride(0), residual.stride(0) if residual is not None else 0,
            hidden, eps,
            BLOCK=block, HAS_RESIDUAL=residual is not None, num_warps=_num_warps(block),
            **pdl_launch(pdl_enabled(x)),
        )
    return out if residual is None else (out, new_residual)


@triton.jit
def _rotate_heads(
    base_ptr,  # [num_heads, head_dim] of one token
    stride_h,
    num_heads,
    cos, sin,  # [BLOCK_D] fp32
    offs_d, mask_d,  # [BLOCK_D]
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_h < num_heads)[:, None] & mask_d[None, :]
    ptr1 = base_ptr + offs_h[:, None] * stride_h + offs_d[None, :]  # first half of each head
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr1 + HALF, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(ptr1, out1.to(base_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr1 + HALF, out2.to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,  # [num_tokens] int64 or int32
    q_ptr,  # [num_tokens, num_heads, head_dim], rotated in place
    k_ptr,  # [num_tokens, num_kv_heads, head_dim], rotated in place
    cos_sin_ptr,  # [max_position, head_dim]: cos | sin, each head_dim // 2 wide
    stride_qt, stride_qh,  # query strides (token, head); head_dim stride is 1
    stride_kt, stride_kh,
    stride_c,  # cos_sin_cache row stride
    num_heads, num_kv_heads,
    HALF: tl.constexpr,  # head_dim // 2
    BLOCK_D: tl.constexpr,  # HALF rounded up to a power of two
    BLOCK_HQ: tl.constexpr,  # num_heads rounded up to a power of two
    BLOCK_HK: tl.constexpr,  # num_kv_heads rounded up to a power of two
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_c + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_c + HALF + offs_d, mask=mask_d, other=0.0)
    sin = sin.to(tl.float32)
    _rotate_heads(q_ptr + token * stride_qt, stride_qh, num_heads, cos, sin, offs_d, mask_d,
                  HALF, BLOCK_HQ)
    _rotate_heads(k_ptr + token * stride_kt, stride_kh, num_kv_heads, cos, sin, offs_d, mask_d,
                  HALF, BLOCK_HK)


def rotary_triton(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE in the NeoX rotate_half layout, computed in fp32, written IN PLACE into query and
    key (which are returned). The torch path returns new tensors; in the model q and k are
    views of the fused qkv output that nothing else reads, so overwriting them is safe there.
    Positions are not range-checked (that would need a host sync): each must be < max_position.

    Args:
        positions: [num_tokens] int64 or int32, contiguous, same device.
        query: [num_tokens, num_heads, head_dim] fp16/bf16/fp32, head_dim contiguous; token and
            head strides are free (e.g. a view into the qkv projection's output).
        key: [num_tokens, num_kv_heads, head_dim], same dtype and head_dim as query.
        cos_sin_cache: [max_position, head_dim], cos in the first half of the columns, sin in
            the second; fp32 normally (other float dtypes are upcast), last dim contiguous.
        validate: check the above (ValueError); False skips the checks (see the module doc).
    """
    if validate:
        _check_device(query.device, key=key, positions=positions, cos_sin_cache=cos_sin_cache)
        check_index("query", query, 3, SUPPORTED_DTYPES, query.device)
        check_index("key", key, 3, (query.dtype,), query.device)
        check_index("positions", positions, 1, (torch.int64, torch.int32), query.device)
        check_index("cos_sin_cache", cos_sin_cache, 2, SUPPORTED_DTYPES, query.device)
        num_tokens, _, head_dim = query.shape
        if head_dim % 2 or key.shape[2] != head_dim or cos_sin_cache.shape[1] != head_dim:
            raise ValueError(f"head_dim must be even and agree: query {tuple(query.shape)}, key "
                             f"{tuple(key.shape)}, cos_sin_cache {tuple(cos_sin_cache.shape)}")
        if key.shape[0] != num_tokens or positions.shape[0] != num_tokens:
            raise ValueError(f"query has {num_tokens} tokens, key {key.shape[0]}, positions "
                             f"{positions.shape[0]}; they must match")
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    if num_tokens > 0:
        half = head_dim // 2
        _rotary_kernel[(num_tokens,)](
            positions, query, key, cos_sin_cache,
            query.stride(0), query.stride(1), key.stride(0), key.stride(1),
            cos_sin_cache.stride(0),
            num_heads, num_kv_heads,
            HALF=half, BLOCK_D=next_pow2(half),
            BLOCK_HQ=next_pow2(num_heads), BLOCK_HK=next_pow2(num_kv_heads),
            num_warps=_num_warps(next_pow2(num_heads) * next_pow2(half)),
        )
    return query, key


@triton.jit
def _rotary_write_kv_kernel(
    positions_ptr,  # [num_tokens] int64 or int32
    q_ptr,  # [num_tokens, num_heads, head_dim], rotated in place
    k_ptr,  # [num_tokens, num_kv_heads, head_dim], rotated in place
    v_ptr,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_ptr,  # [max_position, head_dim]: cos | sin
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # k_cache's shape; strides stride_vc* (K's, or dim-major: `v_dim_major`)
    slot_mapping_ptr,  # [num_tokens], < 0 = no cache write (padding)
    k_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; written when KV_FP8
    v_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; written when KV_FP8
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_c,
    stride_cb, stride_cs, stride_ch,  # K cache strides (block, slot, head)
    stride_vcb, stride_vcs, stride_vch, stride_vcd,  # V cache strides (block, slot, head, dim)
    stride_sb, stride_sh,  # scale strides (block, head); the slot stride is 1
    num_heads, num_kv_heads,
    HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    KV_FP8: tl.constexpr,  # the caches are uint8 views of fp8 caches: quantize, store scales
    V_DIM_MAJOR: tl.constexpr = False,  # v_cache is a dim-major view (`v_dim_major`)
    ROUND_ROWS: tl.constexpr = False,  # KV_FP8: key and value rows get what the cache holds
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (pdl_enabled)
):
    """One token: RoPE on its query and key heads (as `_rotary_kernel`), then its rotated key
    and its value into cache slot slot_mapping[token] (as `_write_kv_kernel`)."""
    pdl_prologue(PDL)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_c + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_c + HALF + offs_d, mask=mask_d, other=0.0)
    sin = sin.to(tl.float32)
    _rotate_heads(q_ptr + token * stride_qt, stride_qh, num_heads, cos, sin, offs_d, mask_d,
                  HALF, BLOCK_HQ)
    # the key: rotated in place, and the rotated halves also to the cache
    offs_h = tl.arange(0, BLOCK_HK)
    mask = (offs_h < num_kv_heads)[:, None] & mask_d[None, :]
    k1_ptr = k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    x1 = tl.load(k1_ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(k1_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    k1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(k_ptr.dtype.element_ty)
    k2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(k_ptr.dtype.element_ty)
    tl.store(k1_ptr, k1, mask=mask)
    tl.store(k1_ptr + HALF, k2, mask=mask)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        dst = ((slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
               + offs_h[:, None] * stride_ch + offs_d[None, :])
        if V_DIM_MAJOR:  # (unit and BLOCK_SIZE strides as literals: attention_triton.py)
            dst_v = ((slot // BLOCK_SIZE) * stride_vcb + offs_h[:, None] * stride_vch
                     + offs_d[None, :] * BLOCK_SIZE + slot % BLOCK_SIZE)
            half_v = HALF * BLOCK_SIZE
        else:
            dst_v = ((slot // BLOCK_SIZE) * stride_vcb + (slot % BLOCK_SIZE) * stride_vcs
                     + offs_h[:, None] * stride_vch + offs_d[None, :])
            half_v = HALF
        v1_ptr = v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
        v1 = tl.load(v1_ptr, mask=mask, other=0.0)
        v2 = tl.load(v1_ptr + HALF, mask=mask, other=0.0)
        if KV_FP8:
            # the key as rounded to its dtype (what the unfused path writes), then quantized
            # new names: triton (3.6, compiled) refuses a variable retyped inside the runtime if
            k1f = k1.to(tl.float32)
            k2f = k2.to(tl.float32)
            v1f = v1.to(tl.float32)
            v2f = v2.to(tl.float32)
            k_scale = fp8_row_scale(
                tl.maximum(tl.max(tl.abs(k1f), 1), tl.max(tl.abs(k2f), 1)))  # [BLOCK_HK]
            v_scale = fp8_row_scale(
                tl.maximum(tl.max(tl.abs(v1f), 1), tl.max(tl.abs(v2f), 1)))
            scale_dst = ((slot // BLOCK_SIZE) * stride_sb + offs_h * stride_sh
                         + slot % BLOCK_SIZE)
            h_mask = offs_h < num_kv_heads
            tl.store(k_scales_ptr + scale_dst, k_scale, mask=h_mask)
            tl.store(v_scales_ptr + scale_dst, v_scale, mask=h_mask)
            k1_code = fp8_quantize(k1f, k_scale)
            k2_code = fp8_quantize(k2f, k_scale)
            v1_code = fp8_quantize(v1f, v_scale)
            v2_code = fp8_quantize(v2f, v_scale)
            tl.store(k_cache_ptr + dst, k1_code, mask=mask)
            tl.store(k_cache_ptr + dst + HALF, k2_code, mask=mask)
            tl.store(v_cache_ptr + dst_v, v1_code, mask=mask)
            tl.store(v_cache_ptr + dst_v + half_v, v2_code, mask=mask)
            if ROUND_ROWS:  # the rows as the cache holds them (as `_write_kv_kernel`)
                k_s = k_scale[:, None]
                v_s = v_scale[:, None]
                row_ty = k_ptr.dtype.element_ty
                tl.store(k1_ptr, (fp8_e4m3_value(k1_code) * k_s).to(row_ty), mask=mask)
                tl.store(k1_ptr + HALF, (fp8_e4m3_value(k2_code) * k_s).to(row_ty), mask=mask)
                tl.store(v1_ptr, (fp8_e4m3_value(v1_code) * v_s).to(row_ty), mask=mask)
                tl.store(v1_ptr + HALF, (fp8_e4m3_value(v2_code) * v_s).to(row_ty), mask=mask)
        else:
            tl.store(k_cache_ptr + dst, k1.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(k_cache_ptr + dst + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + dst_v, v1.to(v_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + dst_v + half_v, v2.to(v_cache_ptr.dtype.element_ty),
                     mask=mask)


def rotary_write_kv_triton(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    validate: bool = True,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    round_rows: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotary_triton` then `write_kv_triton(key, value, k_cache, v_cache, slot_mapping)` in
    one kernel: a token's rotated key goes to its cache slot straight from registers, and a
    step launches one kernel per layer instead of two. Same results as the two calls.

    Args:
        positions, query, key, cos_sin_cache: as `rotary_triton` (query and key are rotated in
            place and returned).
        value: [num_tokens, num_kv_heads, head_dim], key's dtype, head_dim contiguous.
        k_cache, v_cache, slot_mapping: as `write_kv_triton` (negative slots are skipped).
        validate: check the above (ValueError); False skips the checks (see the module doc).
        k_scales, v_scales: as `write_kv_triton` (an FP8 cache's scales, else None).
        round_rows: as `write_kv_triton`: with an FP8 cache, the rotated key and the value
            rows are left holding what the cache holds.
    """
    if validate:
        rotary_triton(positions[:0], query[:0], key[:0], cos_sin_cache)  # checks only
        write_kv_triton(key[:0], value[:0], k_cache, v_cache, slot_mapping[:0],
                        k_scales=k_scales, v_scales=v_scales)  # checks only
        if value.shape != key.shape or value.dtype != key.dtype:
            raise ValueError(f"value {tuple(value.shape)} {value.dtype} must match key "
                             f"{tuple(key.shape)} {key.dtype}")
        if not (positions.shape[0] == query.shape[0] == key.shape[0] == slot_mapping.shape[0]):
            raise ValueError(f"positions {positions.shape[0]}, query {query.shape[0]}, key "
                             f"{key.shape[0]} and slot_mapping {slot_mapping.shape[0]} tokens "
                             "must match")
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    if num_tokens > 0:
        half = head_dim // 2
        fp8 = is_fp8(k_cache.dtype)
        if fp8:  # the kernel stores the fp8 bytes it computes (see pagedrt.ops.fp8_triton)
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        else:
            k_scales = v_scales = k_cache  # unused by the kernel
        _rotary_write_kv_kernel[(num_tokens,)](
            positions, query, key, value, cos_sin_cache, k_cache, v_cache, slot_mapping,
            k_scales, v_scales,
            query.stride(0), query.stride(1), key.stride(0), key.stride(1),
            value.stride(0), value.stride(1), cos_sin_cache.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *v_cache.stride(),
            k_scales.stride(0), k_scales.stride(1),
            num_heads, num_kv_heads,
            HALF=half, BLOCK_D=next_pow2(half),
            BLOCK_HQ=next_pow2(num_heads), BLOCK_HK=next_pow2(num_kv_heads),
            BLOCK_SIZE=k_cache.shape[1], KV_FP8=fp8, V_DIM_MAJOR=v_dim_major(v_cache),
            ROUND_ROWS=fp8 and round_rows,
            num_warps=_num_warps(next_pow2(num_heads) * next_pow2(half)),
            **pdl_launch(pdl_enabled(query)),
        )
    return query, key


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_tokens, 2 * d]: gate | up
    out_ptr,  # [num_tokens, d] contiguous
    stride_x,  # row stride of x; the last dim has stride 1
    d,
    BLOCK: tl.constexpr,  # columns per program
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    # torch rounds silu(gate) to the input dtype before multiplying by up; so do we
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * d + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """SwiGLU activation `silu(x[:, :d]) * x[:, d:]` in one pass.

    Args:
        x: [num_tokens, 2 * d] fp16/bf16/fp32, last dim contiguous (rows may be strided).
        validate: check x (ValueError); False skips the checks (see the module doc).

    Returns:
        [num_tokens, d], x's dtype, new contiguous tensor.
    """
    num_tokens, width = x.shape
    if validate:
        check_index("x", x, 2, SUPPORTED_DTYPES, x.device)
        if width % 2:
            raise ValueError(f"x has {width} columns; expected an even [gate | up] width")
    d = width // 2
    out = torch.empty((num_tokens, d), dtype=x.dtype, device=x.device)
    if num_tokens > 0 and d > 0:
        block = min(1024, next_pow2(d))
        grid = (num_tokens, triton.cdiv(d, block))
        _silu_and_mul_kernel[grid](x, out, x.stride(0), d, BLOCK=block,
                                   num_warps=_num_warps(block))
    return out
