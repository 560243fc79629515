"""The sampler's exponential race in one Triton kernel (docs/design.md, "Host work per step"):
one token per row, read from the logits in one pass, without the float32 softmax.

The torch path (`pagedrt.engine.sampler`) upcasts the [B, V] logits to float32, divides them by
the temperature, takes the softmax, clamps the Exp(1) noise q and takes argmax(softmax / q):
for 256 rows of a 151,936-token vocabulary each of those passes moves 155 MB, about half a
millisecond of an H200's decode step in all. The race only needs the argmax, and

    argmax_i softmax(x / T)_i / q_i = argmax_i (x_i / T - log q_i)

(the log is increasing and the softmax's normalizer is the same for every i), so here one
program per row walks its vocabulary in chunks of BLOCK logits: score_i = x_i / T - log(q_i) for
a sampled row (q clamped to the smallest normal float, as the torch path clamps it), x_i for a
greedy row (its argmax; its noise is not read), keeping the best score and the lowest token id
holding it (a later chunk replaces it only with a strictly better score), as `torch.argmax`
picks. One launch: on a lent H200 whose host is slow a Triton launch costs tens of
microseconds of host time, which a host-bound step pays in full.

The same noise gives the same token as the torch path up to float32 rounding (a division and a
log against a softmax and a division: a different token only where two candidates' scores
agree to a few ulps). tests/test_sample_triton.py checks both against each other under the
interpreter; the torch path stays the reference and the CPU path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # logits per iteration of a row's program
TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny: the torch path's clamp of q


@triton.jit
def _race_kernel(x_ptr, stride_x, q_ptr, stride_q, temp_ptr, stride_t, greedy_ptr, stride_g,
                 out_ptr, vocab, BLOCK: tl.constexpr, TINY: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    # (the flag broadcast to the block first: the interpreter cannot AND a scalar into a mask)
    flag = tl.load(greedy_ptr + r * stride_g).to(tl.float32)
    sampled = (tl.zeros([BLOCK], tl.float32) + flag) == 0
    temperature = tl.load(temp_ptr + r * stride_t)
    best = tl.full([], float("-inf"), tl.float32)
    best_tok = tl.full([], 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < vocab
        x = tl.load(x_ptr + r * stride_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
        q = tl.load(q_ptr + r * stride_q + offs, mask=ok & sampled, other=1.0)
        # (division rounded to nearest, as torch divides)
        score = tl.where(sampled, tl.math.div_rn(x, temperature) - tl.log(tl.maximum(q, TINY)),
                         x)
        score = tl.where(ok, score, float("-inf"))
        top = tl.max(score, axis=0)
        tok = tl.min(tl.where((score == top) & ok, offs, vocab), axis=0)
        better = top > best
        best_tok = tl.where(better, tok, best_tok)
        best = tl.where(better, top, best)
    tl.store(out_ptr + r, best_tok.to(tl.int64))


def race_argmax_triton(logits: torch.Tensor, noise: torch.Tensor,
                       temperature: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """One token per row: argmax(softmax(logits / temperature) / noise) for sampled rows (the
    exponential race), argmax(logits) for greedy rows; see the module docstring.

    Args:
        logits: [B, V] float16, bfloat16 or float32, unit stride along V. Not modified.
        noise: [B, V] float32 Exp(1) draws (values at or below the smallest normal float
            count as it), unit stride along V; greedy rows' entries are not read.
        temperature: [B] float32, any stride, > 0 (read for sampled rows only; 1 where the
            logits are already divided).
        greedy: [B] bool, integer or float, any stride: nonzero is greedy.
    Returns:
        [B] int64 token ids on the logits' device.
    Raises:
        ValueError: shapes, dtypes, strides or devices that do not match.
    """
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [B, V] with unit stride along V, got shape "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    if logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"logits.dtype is {logits.dtype}; use float16, bfloat16 or float32")
    num_rows, vocab = logits.shape
    if tuple(temperature.shape) != (num_rows,) or tuple(greedy.shape) != (num_rows,):
        raise ValueError(f"temperature {tuple(temperature.shape)} and greedy "
                         f"{tuple(greedy.shape)} must be [{num_rows}]")
    if temperature.dtype != torch.float32:
        raise ValueError(f"temperature.dtype is {temperature.dtype}; use float32")
    if (tuple(noise.shape) != (num_rows, vocab) or noise.dtype != torch.float32
          or noise.stride(1) != 1):
        raise ValueError(f"noise must be [{num_rows}, {vocab}] float32 with unit stride along "
                         f"V, got {tuple(noise.shape)} {noise.dtype} strides {noise.stride()}")
    tensors = (noise, temperature, greedy)
    if any(t.device != logits.device for t in tensors):
        raise ValueError(f"logits, noise, temperature and greedy must share a device, got "
                         f"{[str(t.device) for t in (logits, *tensors)]}")
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    if greedy.dtype == torch.bool:
        greedy = greedy.view(torch.uint8)
    _race_kernel[(num_rows,)](
        logits, logits.stride(0), noise, noise.stride(0), temperature, temperature.stride(0),
        greedy, greedy.stride(0), out, vocab, BLOCK=BLOCK, TINY=TINY, num_warps=8)
    return out
