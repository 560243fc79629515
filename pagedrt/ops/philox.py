"""Counter-based random draws for seeded sampling (docs/design.md, "Seeded sampling").

A seeded request's noise is a pure function of its key and where it is drawn, not the state
of a generator: the draw for vocabulary entry `token` of the token at position `position`
(the index of the token being sampled in the sequence, prompt included) in stream `stream`
(0: the exponential race of a sampled token; 1: the acceptance uniform of a verified draft)
for the key `key` (a request's seed plus the sample's index among its n, so that sample i of
seed s draws what a request with seed s + i draws alone) is

    bits = Philox4x32-10(key, counter = (token, position, stream, 0)), first output word
    u    = (floor(bits / 2**8) + 0.5) / 2**24        in (0, 1), exact in float32
    q    = -log(u)                                   Exp(1), for the race

Philox4x32-10 is the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel
random numbers: as easy as 1, 2, 3" (SC 2011), with the round and key constants of that
paper; `triton.language.philox` implements the same function, so a Triton kernel can draw
in registers what this module computes with torch ops (pagedrt/ops/philox_triton.py; the
tests check both against each other and against the paper's known-answer vectors).

Because nothing is carried between draws, a batch's seeded rows are drawn by one kernel
launch whatever their number (a `torch.Generator` per row needs one launch per row), a
request's draws do not depend on the batch it runs in or on how often it was preempted, and
every tensor-parallel rank draws the same values.

Here everything is in int64 tensors holding 32-bit words; a 32 x 32-bit product is taken in
int64, whose multiplication wraps modulo 2**64, so both of its 32-bit words are exact.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
# Philox4x32 constants (Salmon et al. 2011, section 5): the two round multipliers and the
# two key increments (the "Weyl sequence": the golden ratio and sqrt(3) - 1, times 2**32)
ROUND_A = 0xD2511F53
ROUND_B = 0xCD9E8D57
KEY_A = 0x9E3779B9
KEY_B = 0xBB67AE85
NUM_ROUNDS = 10

STREAM_RACE = 0  # the Exp(1) draws of an exponential race
STREAM_ACCEPT = 1  # the uniforms that accept or reject a draft token


def philox_bits(key: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor,
                c3: torch.Tensor | int = 0) -> torch.Tensor:
    """First output word of Philox4x32-10 for 64-bit keys and four 32-bit counter words.

    Args:
        key: int64, any shape broadcastable with the counters; its low and high 32 bits are
            the two key words (as `triton.language.philox` splits a 64-bit seed).
        c0, c1, c2, c3: int64 counter words (only their low 32 bits are used), broadcastable.
    Returns:
        int64 tensor of the broadcast shape, values in [0, 2**32).
    """
    # the round keys: k + r * increment (mod 2**32), for r = 0 .. 9, in a trailing dimension
    steps = torch.arange(NUM_ROUNDS, dtype=torch.int64, device=key.device)
    k0 = ((key & MASK32)[..., None] + steps * KEY_A) & MASK32
    k1 = (((key >> 32) & MASK32)[..., None] + steps * KEY_B) & MASK32
    c0, c1, c2 = c0 & MASK32, c1 & MASK32, c2 & MASK32
    c3 = (c3 & MASK32) if isinstance(c3, torch.Tensor) else torch.full_like(c0, c3 & MASK32)
    for r in range(NUM_ROUNDS):
        # a 32 x 32-bit product: int64 multiplication wraps modulo 2**64 (two's complement),
        # so its low 64 bits, and with them both 32-bit words, are exact
        prod_b, prod_a = c2 * ROUND_B, c0 * ROUND_A
        c0, c1, c2, c3 = (((prod_b >> 32) & MASK32) ^ c1 ^ k0[..., r], prod_b & MASK32,
                          ((prod_a >> 32) & MASK32) ^ c3 ^ k1[..., r], prod_a & MASK32)
    return c0


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in (0, 1) from 32-bit words (int64 tensor): the top 24 bits, offset
    by half a step, so that neither 0 nor 1 occurs and every value is exact in float32."""
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def counter_draws(keys: torch.Tensor, positions: torch.Tensor, width: int, stream: int,
                  exponential: bool) -> torch.Tensor:
    """The draws of the module docstring for S keyed rows, with torch ops (the reference,
    and the CPU path).

    Args:
        keys: [S] int64, each row's key.
        positions: [S, P] int64, the positions drawn for (>= 0, < 2**32).
        width: draws per position: the vocabulary entries 0 .. width - 1.
        stream: STREAM_RACE or STREAM_ACCEPT.
        exponential: Exp(1) draws (-log u) if True, else the uniforms u.
    Returns:
        [S, P, width] float32 on the keys' device.
    """
    token = torch.arange(width, dtype=torch.int64, device=keys.device)
    bits = philox_bits(keys[:, None, None], token[None, None, :], positions[:, :, None],
                       torch.full_like(positions[:, :, None], stream))
    u = uniform_from_bits(bits)
    return -torch.log(u) if exponential else u


def fill_counter_draws_(out: torch.Tensor, index: torch.Tensor, keys: torch.Tensor,
                        positions: torch.Tensor, stream: int, exponential: bool,
                        use_kernel: bool | None = None) -> None:
    """out[index[s], p, :] = counter_draws(keys, positions, W, stream, exponential)[s, p]:
    one Triton launch (pagedrt/ops/philox_triton.py) on CUDA, torch ops elsewhere.

    Args:
        out: [R, P, W] float32, unit stride along W; written in place.
        index: [S] int64 distinct rows of `out`; keys: [S] int64; positions: [S, P] int64,
            all on out's device.
        use_kernel: None: the kernel on CUDA when Triton is importable; True or False decides
            alone (True on CPU tensors runs it under TRITON_INTERPRET=1: the tests).
    """
    if use_kernel is None:
        from pagedrt.ops.attention import triton_available

        use_kernel = out.is_cuda and triton_available()
    if use_kernel:
        from pagedrt.ops.philox_triton import fill_counter_draws_triton

        fill_counter_draws_triton(out, index, keys, positions.contiguous(), stream, exponential)
    elif len(index):
        out[index] = counter_draws(keys, positions, out.shape[2], stream, exponential)
