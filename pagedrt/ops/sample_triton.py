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

Split rows (`num_splits` > 1; the engine's sampler asks for `sample_splits` of them unless
PAGEDRT_SAMPLE_SPLIT=0): one program per row walks 151,936 logits one chunk after another, so
a batch of a few rows keeps a few SMs busy and 256 rows take two waves. With splits the grid
is (rows, num_splits): each program takes one contiguous span of the row (a multiple of
BLOCK), stores its best score and token as a partial, and counts in on its row's arrival
counter (a CTA barrier, then an acq_rel atomic at GPU scope: pagedrt/ops/arrival_counters.py,
whose module doc gives the memory-order argument); the row's last program to arrive reads the
partials from L2 and keeps the best score of the lowest span holding it, and that span's
token, so the token is the one the unsplit walk picks whichever program arrives last. The
combine reads MAX_SPLITS partials (masked past the row's spans), so one compiled kernel serves
every split count.
`argmax_triton` is the same kernel for a batch of greedy rows only (no temperature, flag or
noise read): torch.argmax's token, the lowest id holding the maximum, a NaN counting as the
maximum as torch counts it.

The same noise gives the same token as the torch path up to float32 rounding (a division and a
log against a softmax and a division: a different token only where two candidates' scores
agree to a few ulps). tests/test_sample_triton.py checks both against each other under the
interpreter; the torch path stays the reference and the CPU path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.triton_utils import device_sms

BLOCK = 4096  # logits per iteration of a row's program
# the most spans a row is split into; the last program's combine always takes this many
# (masked), so the kernel compiles once for every split count instead of once per power of
# two (a compile inside a serving step stalls it for about a second)
MAX_SPLITS = 64
TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny: the torch path's clamp of q


@triton.jit
def _race_kernel(x_ptr, stride_x, q_ptr, stride_q, temp_ptr, stride_t, greedy_ptr, stride_g,
                 part_ptr, counters_ptr, out_ptr, vocab, span, num_splits,
                 ALL_GREEDY: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr,
                 TINY: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    if ALL_GREEDY:  # (argmax_triton: no flag, temperature or noise to read)
        sampled = tl.zeros([BLOCK], tl.int1)
        temperature = 1.0
    else:
        # (the flag broadcast to the block first: the interpreter cannot AND a scalar into a
        # mask)
        flag = tl.load(greedy_ptr + r * stride_g).to(tl.float32)
        sampled = (tl.zeros([BLOCK], tl.float32) + flag) == 0
        temperature = tl.load(temp_ptr + r * stride_t)
    lo = split * span
    hi = tl.minimum(lo + span, vocab)
    best = tl.full([], float("-inf"), tl.float32)
    best_tok = tl.full([], 0, tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        x = tl.load(x_ptr + r * stride_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
        if ALL_GREEDY:
            score = x
        else:
            q = tl.load(q_ptr + r * stride_q + offs, mask=ok & sampled, other=1.0)
            # (division rounded to nearest, as torch divides)
            score = tl.where(sampled,
                             tl.math.div_rn(x, temperature) - tl.log(tl.maximum(q, TINY)), x)
        # a NaN is the maximum, as torch.argmax takes it; a masked lane never wins
        is_nan = score != score  # noqa: PLR0124
        score = tl.where(ok, tl.where(is_nan, float("inf"), score), float("-inf"))
        top = tl.max(score, axis=0)
        tok = tl.min(tl.where((score == top) & ok, offs, hi), axis=0)
        better = top > best
        best_tok = tl.where(better, tok, best_tok)
        best = tl.where(better, top, best)
    if SPLITS_PAD == 1:
        tl.store(out_ptr + r, best_tok.to(tl.int64))
    else:
        # the span's partial (the token as a float: exact below 2**24, which the wrappers
        # check), then count in; the row's last program keeps the lowest span's best
        tl.store(part_ptr + (r * num_splits + split) * 2, best)
        tl.store(part_ptr + (r * num_splits + split) * 2 + 1, best_tok.to(tl.float32))
        # every thread's stores before the atomic (issued by one thread); acq_rel at GPU scope
        # publishes them and takes those of the programs before (module doc, "Split rows")
        tl.debug_barrier()
        count = tl.atomic_add(counters_ptr + r, 1, sem="acq_rel", scope="gpu")
        if count == num_splits - 1:
            s = tl.arange(0, SPLITS_PAD)
            has = s < num_splits
            # .cg: from L2, where the other SMs' stores are, never a stale L1 line
            scores = tl.load(part_ptr + (r * num_splits + s) * 2, mask=has,
                             other=float("-inf"), cache_modifier=".cg")
            toks = tl.load(part_ptr + (r * num_splits + s) * 2 + 1, mask=has, other=0.0,
                           cache_modifier=".cg")
            top = tl.max(scores, axis=0)
            first = tl.min(tl.where((scores == top) & has, s, SPLITS_PAD), axis=0)
            tok = tl.sum(tl.where(s == first, toks, 0.0), axis=0)
            tl.store(out_ptr + r, tok.to(tl.int64))
            tl.store(counters_ptr + r, 0)  # ready for the next launch


def sample_splits(num_rows: int, vocab: int, sms: int) -> int:
    """Spans per row for a launch of `num_rows` rows: enough programs for about four per SM
    (`sms` multiprocessors), at most one BLOCK-long span per BLOCK of the vocabulary and
    MAX_SPLITS in all, 1 for a single span. E.g. 151,936 logits on 132 SMs: 38 spans of one
    BLOCK at 1-13 rows, 9 at 64, 3 at 256, 1 past 528 rows (docs/design.md, "Seeded
    sampling", has the kernel timings behind the default in its paragraph on rows split over
    programs)."""
    if num_rows <= 0:
        return 1
    return max(1, min(triton.cdiv(vocab, BLOCK), triton.cdiv(4 * sms, num_rows), MAX_SPLITS))


def _launch(logits: torch.Tensor, num_splits: int | None, out: torch.Tensor | None = None, *,
            noise: torch.Tensor | None = None, stride_q: int = 0,
            temperature: torch.Tensor | None = None, stride_t: int = 0,
            greedy: torch.Tensor | None = None, stride_g: int = 0,
            all_greedy: bool = False) -> torch.Tensor:
    """Launch `_race_kernel` over [B, V] logits with `num_splits` spans per row (None: 1),
    writing `out` ([B] int64, contiguous; None: a new tensor). The other tensors are the
    kernel's (None: one the flags leave unread, the logits stand in). Returns the [B] int64
    tokens."""
    num_rows, vocab = logits.shape
    if out is None:
        out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    elif (tuple(out.shape) != (num_rows,) or out.dtype != torch.int64 or out.stride(0) != 1
          or out.device != logits.device):
        raise ValueError(f"out must be [{num_rows}] int64, contiguous, on {logits.device}, got "
                         f"{tuple(out.shape)} {out.dtype} strides {out.stride()} on "
                         f"{out.device}")
    if num_rows == 0:
        return out
    splits = 1 if num_splits is None else int(num_splits)
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"num_splits is {num_splits}; use 1 to {MAX_SPLITS} (or None)")
    span = triton.cdiv(triton.cdiv(vocab, splits), BLOCK) * BLOCK  # whole BLOCKs a span
    splits = triton.cdiv(vocab, span)  # (no empty span)
    if splits > 1 and vocab >= 1 << 24:
        raise ValueError(f"a vocabulary of {vocab} tokens has ids a float32 partial cannot "
                         "hold exactly (2**24 and more); use num_splits=1")
    part = torch.empty((num_rows, splits, 2) if splits > 1 else (1,), dtype=torch.float32,
                       device=logits.device)
    counters = arrival_counters(logits.device, num_rows) if splits > 1 else out
    unread = logits
    _race_kernel[(num_rows, splits)](
        logits, logits.stride(0), unread if noise is None else noise, stride_q,
        unread if temperature is None else temperature, stride_t,
        unread if greedy is None else greedy, stride_g, part, counters, out, vocab, span,
        splits, ALL_GREEDY=all_greedy, SPLITS_PAD=MAX_SPLITS if splits > 1 else 1,
        BLOCK=BLOCK, TINY=TINY, num_warps=8)
    return out


def _check_logits(logits: torch.Tensor) -> tuple[int, int]:
    """(B, V) of [B, V] 16- or 32-bit float logits with unit stride along V; else ValueError."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [B, V] with unit stride along V, got shape "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    if logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"logits.dtype is {logits.dtype}; use float16, bfloat16 or float32")
    return logits.shape


def argmax_triton(logits: torch.Tensor, num_splits: int | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for a batch of greedy rows, in one launch of the race
    kernel without its noise (module docstring, "Split rows"): the lowest token id holding a
    row's maximum, a NaN counting as the maximum.

    Args:
        logits: [B, V] float16, bfloat16 or float32, unit stride along V. Not modified.
        num_splits: spans per row (`sample_splits`; None: as many as `sample_splits` gives
            for this GPU); V must be below 2**24 where more than one.
        out: [B] int64, contiguous, on the logits' device, written with the tokens (the graph
            runner's `last_tokens`); None: a new tensor.
    Returns:
        [B] int64 token ids on the logits' device (`out` where given).
    Raises:
        ValueError: a logits shape, stride or dtype the kernel cannot read, an `out` that
            does not match, or num_splits outside 1 to MAX_SPLITS.
    """
    num_rows, vocab = _check_logits(logits)
    if num_splits is None:
        num_splits = sample_splits(num_rows, vocab, device_sms(logits))
    return _launch(logits, num_splits, out, all_greedy=True)


def race_argmax_triton(logits: torch.Tensor, noise: torch.Tensor,
                       temperature: torch.Tensor, greedy: torch.Tensor,
                       num_splits: int | None = None) -> torch.Tensor:
    """One token per row: argmax(softmax(logits / temperature) / noise) for sampled rows (the
    exponential race), argmax(logits) for greedy rows; see the module docstring.

    Args:
        logits: [B, V] float16, bfloat16 or float32, unit stride along V. Not modified.
        noise: [B, V] float32 Exp(1) draws (values at or below the smallest normal float
            count as it), unit stride along V; greedy rows' entries are not read.
        temperature: [B] float32, any stride, > 0 (read for sampled rows only; 1 where the
            logits are already divided).
        greedy: [B] bool, integer or float, any stride: nonzero is greedy.
        num_splits: spans per row (module docstring, "Split rows"; None or 1: one program a
            row); V must be below 2**24 where more than one.
    Returns:
        [B] int64 token ids on the logits' device.
    Raises:
        ValueError: shapes, dtypes, strides or devices that do not match, or num_splits
            outside 1 to MAX_SPLITS.
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
    if greedy.dtype == torch.bool:
        greedy = greedy.view(torch.uint8)
    return _launch(logits, num_splits, noise=noise, stride_q=noise.stride(0),
                   temperature=temperature, stride_t=temperature.stride(0), greedy=greedy,
                   stride_g=greedy.stride(0))

