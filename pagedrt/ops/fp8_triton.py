"""Triton device functions that quantize K/V rows for an FP8 cache, bit for bit as
`pagedrt.ops.fp8.quantize_fp8` (the scheme is described there).

The fp8 bytes are computed with integer operations on the fp32 bit pattern and stored through
a uint8 view of the cache, rather than with `x.to(tl.float8e4nv)`: Triton's interpreter
(checked on triton 3.9) rounds fp32 -> float8e4nv wrongly when rounding carries into the
exponent (7.95 becomes 4.0, 0.122 becomes 0.0625) and flushes e4m3's subnormals to zero, so
the CPU tests could not check a kernel that used it. The integer path is one code path for the
interpreter and the GPU (triton 3.6 and 3.9), and matches torch's round-to-nearest-even cast.
Reading fp8 back (`tl.load` of a float8e4nv pointer, then `.to(...)`) is exact in the
interpreter for every finite code, and native on the GPU, so the attention kernels do that.
The writers, which hold the bytes they computed in registers, decode them with integer
operations too (`fp8_e4m3_value`) when they round a row to what the cache holds.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp8_e4m3_bits(y):
    """Bytes of float8_e4m3fn nearest to fp32 `y` (ties to even); |y| must be <= 448."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80  # arithmetic shift: bit 7 is the sign bit
    mag = bits & 0x7FFFFFFF
    # normal e4m3 (|y| >= 2^-6): exponent bias 7, keep 3 of fp32's 23 mantissa bits
    exp = (mag >> 23) - 127
    mant = mag & 0x7FFFFF
    keep = mant >> 20
    rest = mant & 0xFFFFF
    round_up = (rest > 0x80000) | ((rest == 0x80000) & ((keep & 1) == 1))
    normal = ((exp + 7) << 3) + keep + round_up.to(tl.int32)  # a carry moves to the exponent
    # subnormal e4m3 (|y| < 2^-6 = fp32 bits 0x3C800000): code k means k * 2^-9, k in 0..8
    t = tl.abs(y) * 512.0  # exact
    whole = t.to(tl.int32)  # truncates; t >= 0
    frac = t - whole.to(tl.float32)
    sub_up = (frac > 0.5) | ((frac == 0.5) & ((whole & 1) == 1))
    subnormal = whole + sub_up.to(tl.int32)
    code = tl.where(mag < 0x3C800000, subnormal, normal)
    return (code | sign).to(tl.uint8)


@triton.jit
def fp8_row_scale(amax):
    """The scales `pagedrt.ops.fp8.fp8_scale` gives for rows whose largest |value| is `amax`
    (fp32, >= 0): amax / 448 correctly rounded, at least the smallest normal fp32."""
    return tl.maximum(tl.math.div_rn(amax, 448.0), 1.1754943508222875e-38)


@triton.jit
def fp8_quantize(x, scale):
    """fp8 bytes of fp32 `x` ([rows, cols]) divided by the rows' `scale` ([rows]) with IEEE
    round-to-nearest division, saturated at +-448 (as `quantize_fp8`)."""
    x, scale = tl.broadcast(x, scale[:, None])
    y = tl.math.div_rn(x, scale)
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    return fp8_e4m3_bits(y)


@triton.jit
def fp8_e4m3_value(code):
    """The fp32 value of float8_e4m3fn bytes `code` (uint8, finite codes), exactly: normal
    codes 2^(e - 7) * (1 + m / 8) built as fp32 bits, subnormal ones m * 2^-9."""
    c = code.to(tl.int32)
    e = (c >> 3) & 0xF
    m = c & 0x7
    negative = (c & 0x80) != 0
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)  # bias 127 - 7
    magnitude = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    return tl.where(negative, -magnitude, magnitude)
