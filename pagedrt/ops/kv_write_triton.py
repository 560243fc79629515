"""Triton kernels that move K/V rows: `write_kv_triton` (new tokens into their slots) and
`copy_blocks_triton` (copy-on-write of whole blocks in every layer).

Both are data movement: one program copies one contiguous row range with 16-byte loads
(head_dim is the contiguous dim of every tensor involved). Into an FP8 cache, the write
quantizes each token's heads and stores their scales beside the block (`pagedrt.ops.fp8`),
and with `round_rows` gives the rows back the values the cache holds; the copy moves bytes,
so it copies FP8 blocks and their scales unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.fp8 import is_fp8
from pagedrt.ops.fp8_triton import fp8_e4m3_value, fp8_quantize, fp8_row_scale
from pagedrt.ops.triton_utils import (
    check_cache_pair,
    check_index,
    check_kv_scales,
    check_same,
    next_pow2,
    v_dim_major,
)


def block_storage(cache: torch.Tensor) -> torch.Tensor:
    """The storage order of a cache indexed by block first: a dim-major V view
    (`v_dim_major`) gives back its [num_blocks, num_kv_heads, head_dim, block_size] storage,
    in which each block is one contiguous run as in every other cache tensor."""
    return cache.permute(0, 2, 3, 1) if v_dim_major(cache) else cache


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strides stride_vc*
    slot_mapping_ptr,  # [num_tokens] int64, < 0 = skip
    k_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; written when KV_FP8
    v_scales_ptr,  # [num_blocks, num_kv_heads, block_size] fp32; written when KV_FP8
    stride_kt, stride_kh,  # key strides (token, head); head_dim stride is 1
    stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,  # K cache strides (block, slot, head)
    stride_vcb, stride_vcs, stride_vch, stride_vcd,  # V cache strides (block, slot, head, dim)
    stride_sb, stride_sh,  # scale strides (block, head); the slot stride is 1
    num_kv_heads,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,  # num_kv_heads rounded up to a power of two
    KV_FP8: tl.constexpr,  # the caches are uint8 views of fp8 caches: quantize, store scales
    V_DIM_MAJOR: tl.constexpr = False,  # v_cache is a dim-major view (`v_dim_major`)
    ROUND_ROWS: tl.constexpr = False,  # KV_FP8: key and value rows get what the cache holds
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, HEAD_DIM)
        mask = (offs_h < num_kv_heads)[:, None]
        src_k = (key_ptr + token.to(tl.int64) * stride_kt
                 + offs_h[:, None] * stride_kh + offs_d[None, :])
        src_v = (value_ptr + token.to(tl.int64) * stride_vt
                 + offs_h[:, None] * stride_vh + offs_d[None, :])
        dst = block * stride_cb + offset * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :]
        if V_DIM_MAJOR:  # (unit and BLOCK_SIZE strides as literals: attention_triton.py)
            dst_v = (block * stride_vcb + offs_h[:, None] * stride_vch
                     + offs_d[None, :] * BLOCK_SIZE + offset)
        else:
            dst_v = block * stride_vcb + offset * stride_vcs + offs_h[:, None] * stride_vch \
                + offs_d[None, :]
        k = tl.load(src_k, mask=mask)
        v = tl.load(src_v, mask=mask)
        if KV_FP8:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            k_scale = fp8_row_scale(tl.max(tl.abs(k), 1))  # [BLOCK_H]
            v_scale = fp8_row_scale(tl.max(tl.abs(v), 1))
            scale_dst = block * stride_sb + offs_h * stride_sh + offset
            h_mask = offs_h < num_kv_heads
            tl.store(k_scales_ptr + scale_dst, k_scale, mask=h_mask)
            tl.store(v_scales_ptr + scale_dst, v_scale, mask=h_mask)
            k_code = fp8_quantize(k, k_scale)
            v_code = fp8_quantize(v, v_scale)
            tl.store(k_cache_ptr + dst, k_code, mask=mask)
            tl.store(v_cache_ptr + dst_v, v_code, mask=mask)
            if ROUND_ROWS:
                tl.store(src_k, (fp8_e4m3_value(k_code) * k_scale[:, None]).to(
                    key_ptr.dtype.element_ty), mask=mask)
                tl.store(src_v, (fp8_e4m3_value(v_code) * v_scale[:, None]).to(
                    value_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + dst_v, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    validate: bool = True,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    round_rows: bool = False,
) -> None:
    """Write new K/V rows into their cache slots, in place; negative slots are skipped.

    Args:
        key, value: [num_tokens, num_kv_heads, head_dim], any float dtype (cast to the cache's),
            head_dim contiguous, same device as the caches.
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], fp16/bf16/fp32
            or float8_e4m3fn, identical shape and dtype; V's strides are K's or those of a
            view of [num_blocks, num_kv_heads, head_dim, block_size] storage (`v_dim_major`).
        slot_mapping: [num_tokens] int64 (int32 accepted), slot = block * block_size + offset.
        validate: check the above (ValueError); the model's attention layers pass False for
            tensors they built (see `pagedrt.ops.fused_triton`).
        k_scales, v_scales: with a float8_e4m3fn cache, [num_blocks, num_kv_heads, block_size]
            float32, written with each token's scales (`pagedrt.ops.fp8`); else None.
        round_rows: with an FP8 cache, also overwrite each written row of key and value with
            what the cache now holds (its fp8 values times its scale, rounded to the rows'
            dtype), so that attention may read a step's own K/V from them instead of the
            cache (`paged_attention_extend_triton`'s key and value).
    """
    if validate:
        block_size, num_kv_heads, head_dim = check_cache_pair(k_cache, v_cache)
        check_kv_scales(k_cache, k_scales, v_scales)
        for name, t in (("key", key), ("value", value)):
            if t.shape[1:] != (num_kv_heads, head_dim) or t.dim() != 3:
                raise ValueError(f"{name} shape {tuple(t.shape)}; expected [num_tokens, "
                                 f"{num_kv_heads}, {head_dim}]")
            check_index(name, t, 3, (torch.float16, torch.bfloat16, torch.float32),
                        k_cache.device)
        check_index("slot_mapping", slot_mapping, 1, (torch.int64, torch.int32), k_cache.device)
        if slot_mapping.shape[0] != key.shape[0]:
            raise ValueError(
                f"slot_mapping has {slot_mapping.shape[0]} entries, key {key.shape[0]} tokens")
    num_tokens = key.shape[0]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if num_tokens == 0:
        return
    fp8 = is_fp8(k_cache.dtype)
    if fp8:  # the kernel stores the fp8 bytes it computes (see pagedrt.ops.fp8_triton)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    else:
        k_scales = v_scales = k_cache  # unused by the kernel
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *v_cache.stride(),
        k_scales.stride(0), k_scales.stride(1),
        num_kv_heads,
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_H=next_pow2(num_kv_heads), KV_FP8=fp8,
        V_DIM_MAJOR=v_dim_major(v_cache), ROUND_ROWS=fp8 and round_rows,
    )


@triton.jit
def _copy_blocks_kernel(
    k_cache_ptr,  # [num_blocks, block_numel] (a contiguous cache viewed flat per block)
    v_cache_ptr,  # [num_blocks, block_numel]
    block_mapping_ptr,  # [num_pairs, 2] int64: (src block, dst block)
    block_numel,  # block_size * num_kv_heads * head_dim
    CHUNK: tl.constexpr,  # elements per program
):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(block_mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * pair + 1).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    k = tl.load(k_cache_ptr + src * block_numel + offs, mask=mask)
    v = tl.load(v_cache_ptr + src * block_numel + offs, mask=mask)
    tl.store(k_cache_ptr + dst * block_numel + offs, k, mask=mask)
    tl.store(v_cache_ptr + dst * block_numel + offs, v, mask=mask)


def copy_blocks_triton(
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy whole blocks src -> dst in every layer (copy-on-write), in place.

    One launch per layer copies its K and V blocks together; copies are rare (a fork writing
    into a shared block), so per-layer launches cost less than gathering layer pointers.
    The copy moves elements unchanged, so it serves any tensor indexed by block first (an FP8
    cache's scales too); one-byte (fp8) tensors are moved as uint8.

    Args:
        k_caches, v_caches: per layer [num_blocks, ...] (e.g. [num_blocks, block_size,
            num_kv_heads, head_dim]), contiguous, all on one device.
        block_mapping: [num_pairs, 2] int64 (src, dst) block ids; moved to the caches' device.
    """
    if len(k_caches) != len(v_caches):
        raise ValueError(f"{len(k_caches)} k_caches but {len(v_caches)} v_caches")
    if block_mapping.numel() == 0 or not k_caches:
        return
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(
            f"block_mapping shape {tuple(block_mapping.shape)}; expected [num_pairs, 2]")
    mapping = block_mapping.to(device=k_caches[0].device, dtype=torch.int64).contiguous()
    num_pairs = mapping.shape[0]
    for layer, (k_cache, v_cache) in enumerate(zip(k_caches, v_caches)):
        check_same(f"k_caches[{layer}]", k_cache, f"v_caches[{layer}]", v_cache)
        k_cache, v_cache = block_storage(k_cache), block_storage(v_cache)
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError(f"layer {layer}: copy_blocks_triton needs caches whose blocks are "
                             "contiguous (a dim-major V view counts)")
        if k_cache.element_size() == 1:  # the interpreter would convert fp8 on the way
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        block_numel = k_cache[0].numel()
        chunk = min(4096, next_pow2(block_numel))
        grid = (num_pairs, triton.cdiv(block_numel, chunk))
        _copy_blocks_kernel[grid](k_cache, v_cache, mapping, block_numel, CHUNK=chunk)
