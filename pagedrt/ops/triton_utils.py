"""Small helpers shared by the Triton wrappers: contract checks and launch constants."""

from __future__ import annotations

import functools
import os

import torch
import triton

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting(tensor: torch.Tensor) -> bool:
    """True when the kernels run under Triton's CPU interpreter.

    The interpreter computes `tl.dot` of two bf16 operands wrongly (garbage, seen on triton
    3.9), so kernels take this as a constexpr flag and upcast dot operands to fp32 when set.
    """
    return os.environ.get("TRITON_INTERPRET") == "1" or not tensor.is_cuda


@functools.lru_cache(maxsize=8)
def num_sms(device_index: int | None) -> int:
    """Multiprocessor count of a CUDA device (4 for the CPU interpreter)."""
    if device_index is None or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sms(tensor: torch.Tensor) -> int:
    return num_sms(tensor.device.index if tensor.is_cuda else None)


def check_cache(name: str, cache: torch.Tensor) -> None:
    """The cache contract: 4-D `[num_blocks, block_size, num_kv_heads, head_dim]`, head_dim
    contiguous (stride 1) so loads along it vectorize to 16 bytes."""
    if cache.dim() != 4:
        raise ValueError(f"{name} must be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got shape {tuple(cache.shape)}")
    if cache.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) is {cache.stride(-1)}; head_dim must be contiguous")
    if cache.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}.dtype is {cache.dtype}; supported: {SUPPORTED_DTYPES}")


def check_same(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"{name_a} ({tuple(a.shape)}, {a.dtype}, {a.device}) and {name_b} "
                         f"({tuple(b.shape)}, {b.dtype}, {b.device}) must match")


def check_index(name: str, t: torch.Tensor, dim: int, dtypes: tuple, device) -> None:
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}.dtype is {t.dtype}; expected one of {dtypes}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the caches on {device}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) is {t.stride(-1)}; its last dim must be contiguous")


def check_head_dim(head_dim: int) -> None:
    if head_dim not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim={head_dim}; the Triton kernels take 16, 32, 64, 128 or 256 "
                         "(use backend='torch' for others)")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
