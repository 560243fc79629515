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

With COUNTER_NOISE (`race_counter_argmax_triton`, PAGEDRT_RACE_COUNTER_NOISE=1) the same
kernel computes each q in registers from Philox counters instead of loading it from a noise
tensor (docs/design.md, "Seeded sampling").

The same noise gives the same token as the torch path up to float32 rounding (a division and a
log against a softmax and a division: a different token only where two candidates' scores
agree to a few ulps). tests/test_sample_triton.py checks both against each other under the
interpreter; the torch path stays the reference and the CPU path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.philox_triton import counter_uniform

BLOCK = 4096  # logits per iteration of a row's program
TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny: the torch path's clamp of q


@triton.jit
def _race_kernel(x_ptr, stride_x, q_ptr, stride_q, temp_ptr, stride_t, greedy_ptr, stride_g,
                 key_ptr, pos_ptr, step_key_ptr, out_ptr, vocab, COUNTER_NOISE: tl.constexpr,
                 STREAM_SEEDED: tl.constexpr, STREAM_UNSEEDED: tl.constexpr,
                 BLOCK: tl.constexpr, TINY: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    # (the flag broadcast to the block first: the interpreter cannot AND a scalar into a mask)
    flag = tl.load(greedy_ptr + r * stride_g).to(tl.float32)
    sampled = (tl.zeros([BLOCK], tl.float32) + flag) == 0
    temperature = tl.load(temp_ptr + r * stride_t)
    if COUNTER_NOISE:  # (race_counter_argmax_triton; no noise tensor: q_ptr is not read)
        # a seeded row: its key at the position it samples (philox.counter_draws); any other
        # row: the step's key at the row's index, in a stream of its own
        position = tl.load(pos_ptr + r)
        seeded = position >= 0
        key = tl.where(seeded, tl.load(key_ptr + r), tl.load(step_key_ptr))
        c1 = tl.where(seeded, position, r).to(tl.int32)  # (< 2**31: a position or a row)
        stream = tl.where(seeded, STREAM_SEEDED, STREAM_UNSEEDED)
    best = tl.full([], float("-inf"), tl.float32)
    best_tok = tl.full([], 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < vocab
        x = tl.load(x_ptr + r * stride_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
        if COUNTER_NOISE:
            q = -tl.log(counter_uniform(key, offs, c1, stream))
        else:
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


def _check_logits(logits: torch.Tensor) -> tuple[int, int]:
    """(B, V) of [B, V] 16- or 32-bit float logits with unit stride along V; else ValueError."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [B, V] with unit stride along V, got shape "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    if logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"logits.dtype is {logits.dtype}; use float16, bfloat16 or float32")
    return logits.shape


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
    num_rows, vocab = _check_logits(logits)
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
        greedy, greedy.stride(0), out, out, out, out, vocab, COUNTER_NOISE=False,
        STREAM_SEEDED=0, STREAM_UNSEEDED=0, BLOCK=BLOCK, TINY=TINY, num_warps=8)
    return out


def race_counter_argmax_triton(logits: torch.Tensor, temperature: torch.Tensor,
                               greedy: torch.Tensor, keys: torch.Tensor,
                               positions: torch.Tensor, step_key: torch.Tensor) -> torch.Tensor:
    """`race_argmax_triton` with the Exp(1) noise drawn in registers instead of read from a
    [B, V] tensor (PAGEDRT_RACE_COUNTER_NOISE=1; docs/design.md, "Seeded sampling"): the noise
    of row b at vocabulary entry t is -log(u), u from the first Philox4x32-10 word of
    (pagedrt/ops/philox.py's scheme)
        seeded row (positions[b] >= 0): key keys[b], counter (t, positions[b], STREAM_RACE, 0),
            the draws `philox.counter_draws` gives and the seeded path reads from its tensor;
        other sampled rows: key step_key[0], counter (t, b, STREAM_UNSEEDED, 0).
    So a seeded row samples the same token as with the noise tensor, and the [B, V] float32
    noise is neither written nor read (155 MB each way at 256 rows of a 151,936-token
    vocabulary). Greedy rows take their argmax.

    Args:
        logits: [B, V] float16, bfloat16 or float32, unit stride along V. Not modified.
        temperature: [B] float32, > 0 for sampled rows.
        greedy: [B] bool, integer or float: nonzero is greedy.
        keys: [B] int64, each seeded row's key (`sampler.seed_key`); others' are not read.
        positions: [B] int64, each seeded row's sampled position (< 2**31), -1 for others.
        step_key: [1] int64, this step's key for the unseeded rows (drawn from the engine's
            generator, so a seeded engine repeats its draws).
    Returns:
        [B] int64 token ids on the logits' device.
    Raises:
        ValueError: shapes, dtypes or devices that do not match.
    """
    from pagedrt.ops.philox import STREAM_RACE, STREAM_UNSEEDED

    num_rows, vocab = _check_logits(logits)
    rows_of = {"temperature": temperature, "greedy": greedy, "keys": keys,
               "positions": positions}
    bad = {name: tuple(t.shape) for name, t in rows_of.items() if tuple(t.shape) != (num_rows,)}
    if bad or tuple(step_key.shape) != (1,):
        raise ValueError(f"temperature, greedy, keys and positions must be [{num_rows}] and "
                         f"step_key [1], got {bad or {'step_key': tuple(step_key.shape)}}")
    if temperature.dtype != torch.float32:
        raise ValueError(f"temperature.dtype is {temperature.dtype}; use float32")
    if any(t.dtype != torch.int64 for t in (keys, positions, step_key)):
        raise ValueError("keys, positions and step_key must be int64")
    if any(t.device != logits.device for t in (*rows_of.values(), step_key)):
        raise ValueError("logits, temperature, greedy, keys, positions and step_key must "
                         "share a device")
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    if greedy.dtype == torch.bool:
        greedy = greedy.view(torch.uint8)
    keys, positions = keys.contiguous(), positions.contiguous()
    _race_kernel[(num_rows,)](
        logits, logits.stride(0), logits, 0, temperature, temperature.stride(0), greedy,
        greedy.stride(0), keys, positions, step_key, out, vocab, COUNTER_NOISE=True,
        STREAM_SEEDED=STREAM_RACE, STREAM_UNSEEDED=STREAM_UNSEEDED, BLOCK=BLOCK, TINY=TINY,
        num_warps=8)
    return out
