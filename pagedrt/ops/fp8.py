"""FP8 (float8 e4m3) KV cache: the quantization scheme and its torch reference.

An FP8 cache stores K and V as `torch.float8_e4m3fn` (4 exponent bits, 3 mantissa bits, no
infinities, largest finite value 448; OCP "FP8 Formats for Deep Learning", Micikevicius et
al. 2022) and, beside each block, one float32 scale per token and KV head for K and one for V:

    k_cache  [num_blocks, block_size, num_kv_heads, head_dim]  float8_e4m3fn
    k_scales [num_blocks, num_kv_heads, block_size]             float32   (v likewise)

    K[token, head, :] ~= k_cache[block, offset, head, :] * k_scales[block, head, offset]

The scales are dynamic: computed from the token's own values as it is written (no
calibration), scale = amax / 448 with amax the largest |value| of that token's head, so the
largest value is stored exactly (as 448) and the others with e4m3's relative precision. The
division is IEEE round-to-nearest everywhere (torch's `/`, `tl.math.div_rn` in the kernels,
numpy's in Triton's interpreter), so the torch reference, the GPU kernels and the interpreter
quantize to the same bytes. Why per token and KV head, why amax / 448 rather than a power of
two (which would make the division exact), and what a Hadamard rotation of the keys would add:
docs/design.md, "FP8 KV cache", has the accuracy of each scheme on SmolLM2.

The scale layout puts one head's block_size scales next to each other, so the attention kernels
read them for a tile of tokens in a few contiguous segments. At head_dim 128 the scales add
4 / 128 = 3% to the cache's bytes (6% at head_dim 64).
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_DTYPE = torch.float32

FP32_TINY = torch.finfo(torch.float32).tiny  # the scale of an all-zero row (any works)


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """Scales for rows whose largest |value| is `amax` (any shape): amax / 448 in float32,
    correctly rounded, at least FP32_TINY. Same tensor shape, float32.

    The divisor is a tensor on amax's device, not a Python number: torch's CUDA division by a
    host scalar multiplies by its reciprocal, which is off by one ulp for some amax (the
    kernels divide, and the torch path is their oracle: tests/gpu/test_fp8_kv_gpu.py)."""
    amax = amax.float()
    return (amax / torch.full((), FP8_MAX, device=amax.device)).clamp_min(FP32_TINY)


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows of K or V, one scale per (token, head).

    Args:
        x: [num_tokens, num_kv_heads, head_dim], any float dtype.
    Returns:
        (values [num_tokens, num_kv_heads, head_dim] float8_e4m3fn,
         scales [num_tokens, num_kv_heads] float32), with x ~= values * scales[..., None].
    """
    xf = x.float()
    scales = fp8_scale(xf.abs().amax(dim=-1))
    values = (xf / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values, scales


def dequantize_fp8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """values [..., head_dim] float8_e4m3fn times scales [...] -> float32 [..., head_dim]."""
    return values.float() * scales[..., None]


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether a cache of this dtype holds FP8 values with scales beside it."""
    return dtype == FP8_DTYPE
