"""Counter-based draws for seeded sampling (pagedrt/ops/philox.py, pagedrt/ops/philox_triton.py):
the torch path against the Philox paper's known answers, the Triton kernel (interpreter)
against the torch path, their statistics, and the sampler drawing every seeded row in a fixed
number of tensor ops (CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagedrt.engine.sampler import Sampler, SamplingRow
from pagedrt.engine.sampling_state import SamplingState
from pagedrt.ops.philox import (
    STREAM_ACCEPT,
    STREAM_RACE,
    counter_draws,
    fill_counter_draws_,
    philox_bits,
)
from pagedrt.ops.philox_triton import fill_counter_draws_triton
from pagedrt.sampling_params import SamplingParams


def _key(k0: int, k1: int) -> torch.Tensor:
    value = (k1 << 32) | k0
    return torch.tensor([value - 2**64 if value >= 2**63 else value])


@pytest.mark.parametrize("key, counter, first_word", [
    # Random123's known-answer vectors for Philox4x32-10 (the library of Salmon et al. 2011)
    ((0, 0), (0, 0, 0, 0), 0x6627E8D5),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF,) * 4, 0x408F276D),
    ((0xA4093822, 0x299F31D0), (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), 0xD16CFE09),
])
def test_philox_matches_the_known_answers(key, counter, first_word):
    c = [torch.tensor([v]) for v in counter]
    assert philox_bits(_key(*key), *c).item() == first_word


@pytest.mark.parametrize("exponential", [False, True])
@pytest.mark.parametrize("width, num_pos", [(1, 3), (1000, 1), (2500, 2), (1024, 4)])
def test_kernel_equals_the_torch_draws(width, num_pos, exponential):
    g = torch.Generator().manual_seed(width + num_pos)
    keys = torch.tensor([0, -5, 2**62 + 7, 12345])
    positions = torch.randint(0, 1 << 20, (4, num_pos), generator=g)
    index = torch.tensor([5, 0, 2, 3])
    out = torch.full((6, num_pos, width), 7.0)
    fill_counter_draws_triton(out, index, keys, positions, STREAM_ACCEPT, exponential)
    ref = counter_draws(keys, positions, width, STREAM_ACCEPT, exponential)
    if exponential:  # -log of the same uniforms: Triton's and torch's log may differ in ulps
        torch.testing.assert_close(out[index], ref, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(out[index], ref)
    assert (out[[1, 4]] == 7.0).all()  # rows not in the index are left alone
    torch_out = torch.full_like(out, 7.0)
    fill_counter_draws_(torch_out, index, keys, positions, STREAM_ACCEPT, exponential,
                        use_kernel=False)
    assert torch.equal(torch_out[index], ref) and (torch_out[[1, 4]] == 7.0).all()


def test_draws_are_uniform_and_exponential_and_depend_on_key_position_and_stream():
    keys = torch.tensor([3, 3, 4, -3])
    positions = torch.tensor([[10], [11], [10], [10]])
    u = counter_draws(keys, positions, 20000, STREAM_ACCEPT, exponential=False)
    assert 0 < u.min() and u.max() < 1
    flat = u.flatten()
    assert abs(flat.mean().item() - 0.5) < 0.005 and abs(flat.var().item() - 1 / 12) < 0.002
    # Kolmogorov-Smirnov distance to U(0, 1), 80,000 draws: about 0.005 expected
    ks = (flat.sort().values - torch.arange(1, len(flat) + 1) / len(flat)).abs().max()
    assert ks < 0.01
    q = counter_draws(keys, positions, 20000, STREAM_RACE, exponential=True)
    assert abs(q.mean().item() - 1) < 0.02 and abs(q.var().item() - 1) < 0.05
    # another position, key or stream: draws with no relation to the first row's
    rows = torch.cat([u[:, 0], q[:1, 0]])
    for other in rows[1:]:
        assert abs(torch.corrcoef(torch.stack([rows[0], other]))[0, 1].item()) < 0.03


def test_kernel_rejects_mismatched_inputs():
    out = torch.zeros(3, 1, 8)
    ok = {"index": torch.tensor([0]), "keys": torch.tensor([1]), "positions": torch.tensor([[2]])}
    for name, bad in [("keys", torch.tensor([1, 2])), ("positions", torch.tensor([[2, 3]])),
                      ("keys", torch.tensor([1], dtype=torch.int32))]:
        with pytest.raises(ValueError, match=name):
            fill_counter_draws_triton(out, **{**ok, name: bad}, stream=0, exponential=True)
    with pytest.raises(ValueError, match="float32"):
        fill_counter_draws_triton(out.double(), **ok, stream=0, exponential=True)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _sample_rows_ops(num_rows: int, num_seeded: int) -> int:
    """Tensor ops of one `sample_rows` call on num_rows rows at temperature 0.8, the first
    num_seeded of them seeded."""
    vocab = 32
    state = SamplingState(num_rows, torch.device("cpu"))
    for r in range(num_rows):
        params = SamplingParams(temperature=0.8, seed=r if r < num_seeded else None)
        state.set_row(r, f"r{r}", params, 0, [1, 2], [], ())
    rows = np.arange(num_rows, dtype=np.int64)
    logits = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(0))
    num_tokens = np.full(num_rows, 2, dtype=np.int64)
    with _CountOps() as ops:
        Sampler(kernel=False).sample_rows(logits, state, rows, [None] * num_rows, num_tokens)
    return ops.count


def test_seeded_rows_are_drawn_in_a_fixed_number_of_ops():
    """With a torch.Generator per seeded row every one of them cost a draw of its own; the
    counter-based draws take the same ops for 2 seeded rows as for 64."""
    assert _sample_rows_ops(64, 2) == _sample_rows_ops(64, 64) == _sample_rows_ops(8, 8)
    assert _sample_rows_ops(64, 2) > _sample_rows_ops(64, 0)  # (the seeded draw is counted)


def test_sample_i_of_seed_s_draws_as_seed_s_plus_i():
    """The n samples of a seeded request are keyed seed + index (as vLLM seeds them): sample 1
    of seed 12 samples what seed 13 samples alone; samples of one request differ."""
    logits = torch.zeros(1, 4096)  # uniform: the token is the noise's argmin
    def token(seed: int, sample_index: int) -> int:
        row = SamplingRow(SamplingParams(temperature=1.0, seed=seed), seed, [1], [], (),
                          sample_index)
        return int(Sampler()(logits, [row]).token_ids[0])
    assert token(12, 1) == token(13, 0) and token(12, 0) != token(12, 1)
    assert token(2**63 - 1, 1) == token(-2**63, 0)  # (the key wraps to int64)
