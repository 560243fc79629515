"""The counter-based draws of pagedrt/ops/philox.py in one Triton kernel: every seeded row of a
batch in one launch (docs/design.md, "Seeded sampling").

One program per (row, position, chunk of BLOCK vocabulary entries) computes Philox4x32-10 in
registers (`triton.language.philox`: the same function as `philox.philox_bits`) and writes
the chunk's uniforms or Exp(1) draws into the row of the output it is given. The uniforms
equal the torch path's bit for bit; the Exp(1) draws are -log of them, where Triton's and
torch's log may differ in the last bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # vocabulary entries per program


@triton.jit
def counter_uniform(key, token, position, stream):
    """The uniforms in (0, 1) of pagedrt/ops/philox.py's scheme for int32 vectors of tokens,
    one key, position (or row) and stream: the first Philox4x32-10 word of
    (token, position, stream, 0), its top 24 bits offset by half a step."""
    zero = token * 0
    bits, _, _, _ = tl.philox(key, token, zero + position, zero + stream, zero)
    return ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _counter_draws_kernel(out_ptr, stride_row, stride_pos, index_ptr, key_ptr, pos_ptr,
                          num_pos, width, stream, EXPONENTIAL: tl.constexpr,
                          BLOCK: tl.constexpr):
    sp = tl.program_id(0)
    s = sp // num_pos
    p = sp % num_pos
    row = tl.load(index_ptr + s).to(tl.int64)
    key = tl.load(key_ptr + s)
    position = tl.load(pos_ptr + sp).to(tl.int32)  # (< 2**31: a sequence position)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    u = counter_uniform(key, offs, position, stream)
    if EXPONENTIAL:
        u = -tl.log(u)
    tl.store(out_ptr + row * stride_row + p * stride_pos + offs, u, mask=offs < width)


def fill_counter_draws_triton(out: torch.Tensor, index: torch.Tensor, keys: torch.Tensor,
                              positions: torch.Tensor, stream: int, exponential: bool) -> None:
    """Overwrite rows of `out` with `philox.counter_draws(keys, positions, W, stream,
    exponential)`: out[index[s], p, :] = the draws of key s at positions[s, p].

    Args:
        out: [R, P, W] float32, unit stride along W; written in place.
        index: [S] int64, distinct rows of `out`.
        keys: [S] int64.
        positions: [S, P] int64, contiguous, each in [0, 2**31).
        stream: philox.STREAM_RACE or philox.STREAM_ACCEPT.
        exponential: Exp(1) draws if True, else uniforms in (0, 1).
    Raises:
        ValueError: shapes, dtypes, strides or devices that do not match.
    """
    if out.dim() != 3 or out.dtype != torch.float32 or out.stride(2) != 1:
        raise ValueError(f"out must be [R, P, W] float32 with unit stride along W, got shape "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")
    _, num_pos, width = out.shape
    s = index.shape[0]
    if (tuple(keys.shape) != (s,) or tuple(positions.shape) != (s, num_pos)
            or not positions.is_contiguous()):
        raise ValueError(f"index {tuple(index.shape)}, keys {tuple(keys.shape)} and positions "
                         f"{tuple(positions.shape)} must be [S], [S] and contiguous "
                         f"[S, {num_pos}]")
    tensors = (index, keys, positions)
    if any(t.dtype != torch.int64 for t in tensors):
        raise ValueError(f"index, keys and positions must be int64, got "
                         f"{[str(t.dtype) for t in tensors]}")
    if any(t.device != out.device for t in tensors):
        raise ValueError("out, index, keys and positions must share a device")
    if s == 0 or width == 0:
        return
    grid = (s * num_pos, triton.cdiv(width, BLOCK))
    _counter_draws_kernel[grid](out, out.stride(0), out.stride(1), index, keys, positions,
                                num_pos, width, stream, EXPONENTIAL=exponential, BLOCK=BLOCK,
                                num_warps=4)
