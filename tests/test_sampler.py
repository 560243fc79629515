"""Sampler: greedy, filters, seeds, penalties, min_tokens, logprobs, statistics (CPU, fast)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from pagedrt.engine.logits_processors import _apply_penalties
from pagedrt.engine.sampler import Sampler, SamplingRow
from pagedrt.sampling_params import SamplingParams

VOCAB = 50


def _row(seed: int | None = None, prompt=(), output=(), eos=(), **kwargs) -> SamplingRow:
    return SamplingRow(SamplingParams(seed=seed, **kwargs), seed, list(prompt), list(output),
                       tuple(eos))


def _logits(num_rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _empirical(logits_row: torch.Tensor, num_draws: int, **kwargs) -> torch.Tensor:
    """Token frequencies over num_draws rows sampled with the same params and one generator."""
    logits = logits_row.expand(num_draws, -1).contiguous()
    rows = [_row(**kwargs) for _ in range(num_draws)]
    tokens = Sampler()(logits, rows, torch.Generator().manual_seed(123)).token_ids
    return torch.bincount(tokens, minlength=logits.shape[1]).float() / num_draws


def test_greedy_equals_argmax_and_top_k_1():
    logits = _logits(8)
    out = Sampler()(logits, [_row(temperature=0.0) for _ in range(8)])
    assert torch.equal(out.token_ids, logits.argmax(-1))
    assert out.token_ids.dtype == torch.int64 and out.logprobs is None
    out = Sampler()(logits, [_row(top_k=1, seed=i) for i in range(8)])
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_disabled_filters_leave_distribution_unchanged():
    logits = _logits(1)[0]
    base = _empirical(logits, 2000)
    for kwargs in ({"top_k": VOCAB}, {"top_k": VOCAB + 7}, {"top_p": 1.0}, {"top_k": 0},
                   {"min_p": 0.0}):
        assert torch.equal(_empirical(logits, 2000, **kwargs), base), kwargs


def test_small_top_p_keeps_only_argmax():
    logits = _logits(4)
    out = Sampler()(logits, [_row(top_p=1e-6, temperature=5.0) for _ in range(4)])
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_top_k_and_top_p_support():
    logits = _logits(1)[0]
    freq = _empirical(logits, 4000, top_k=5)
    allowed = set(logits.topk(5).indices.tolist())
    assert set(freq.nonzero().flatten().tolist()) <= allowed
    probs = torch.softmax(logits, -1)
    sorted_probs, order = probs.sort(descending=True)
    nucleus = int((torch.cumsum(sorted_probs, 0) < 0.8).sum()) + 1
    freq = _empirical(logits, 4000, top_p=0.8)
    assert set(freq.nonzero().flatten().tolist()) <= set(order[:nucleus].tolist())


def test_min_p_filters():
    logits = torch.tensor([[4.0, 3.9, 2.0, 0.0, -1.0]]).expand(3000, -1).contiguous()
    rows = [_row(min_p=0.5) for _ in range(3000)]
    tokens = Sampler()(logits, rows, torch.Generator().manual_seed(0)).token_ids
    # p(1) / p(0) = e^-0.1 > 0.5 is kept; p(2) / p(0) = e^-2 < 0.5 is dropped.
    assert set(tokens.tolist()) == {0, 1}


def test_temperature_sampling_matches_softmax():
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    for temperature in (0.5, 1.0, 2.0):
        freq = _empirical(logits, 20000, temperature=temperature)
        expected = torch.softmax(logits / temperature, -1)
        assert torch.allclose(freq, expected, atol=0.015), (temperature, freq, expected)


def test_seeded_rows_do_not_depend_on_batch():
    logits_pool = _logits(6, seed=1)
    target = logits_pool[0:1]

    def run(batch_logits, rows, position, steps=5):
        tokens = []
        for _ in range(steps):
            out = Sampler()(batch_logits, rows, torch.Generator().manual_seed(len(tokens) + 99))
            tokens.append(int(out.token_ids[position]))
        return tokens

    alone = run(target, [_row(seed=7, top_p=0.9)], 0)
    for batch_size, position in ((2, 1), (5, 3), (6, 0)):
        others = [_row(seed=100 + i, top_k=3) if i % 2 else _row(temperature=0.0 if i % 3 else 1.2)
                  for i in range(batch_size)]
        others[position] = _row(seed=7, top_p=0.9)
        batch = logits_pool[:batch_size].clone()
        batch[position] = target[0]
        assert run(batch, others, position) == alone, (batch_size, position)
    # a different seed gives a different sequence
    logits = torch.zeros(1, 1000)
    a = [int(Sampler()(logits, [r]).token_ids[0]) for r in [_row(seed=1)] * 8]
    b = [int(Sampler()(logits, [r]).token_ids[0]) for r in [_row(seed=2)] * 8]
    assert a != b


def _reference_penalties(logits, prompt, output, rep, freq, pres):
    x = logits.clone()
    for t in set(prompt) | set(output):
        x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
    for t in set(output):
        x[t] -= freq * output.count(t) + pres
    return x


def test_penalties_match_reference_and_hf():
    logits = _logits(4)
    cases = [  # (prompt, output, repetition, frequency, presence)
        ([1, 2, 3], [3, 3, 4], 1.3, 0.0, 0.0),
        ([5], [6, 6, 6, 7], 1.0, 0.5, 0.0),
        ([8, 9], [9, 10, 10], 0.8, -0.4, 1.5),
        ([], [], 2.0, 1.0, 1.0),
    ]
    rows = [_row(temperature=0.0, prompt=p, output=o, repetition_penalty=r, frequency_penalty=f,
                 presence_penalty=pr) for p, o, r, f, pr in cases]
    penalized = _apply_penalties(logits.clone(), rows)
    for i, (p, o, r, f, pr) in enumerate(cases):
        expected = _reference_penalties(logits[i], p, o, r, f, pr)
        assert torch.allclose(penalized[i], expected), i
        if f == 0 and pr == 0 and (p or o):
            hf_processor = RepetitionPenaltyLogitsProcessor(r)
            hf = hf_processor(torch.tensor([p + o]), logits[i : i + 1].clone())
            assert torch.allclose(penalized[i], hf[0]), i
    # the greedy token is the argmax of the penalized logits, and the input is not modified
    original = logits.clone()
    out = Sampler()(logits, rows)
    assert torch.equal(out.token_ids, penalized.argmax(-1))
    assert torch.equal(logits, original)


def test_min_tokens_suppresses_eos_and_stop_ids():
    logits = torch.zeros(4, VOCAB)
    logits[:, 2] = 10.0  # EOS
    logits[:, 3] = 9.0  # a stop token id
    rows = [
        _row(temperature=0.0, eos=(2,), min_tokens=3, output=[5]),  # suppressed
        _row(temperature=0.0, eos=(2,), min_tokens=3, output=[5, 6, 7]),  # reached min_tokens
        _row(temperature=0.0, eos=(2,), min_tokens=3, stop_token_ids=[3]),  # both suppressed
        _row(temperature=0.0, eos=(2,), min_tokens=3, ignore_eos=True),  # EOS is no stop token
    ]
    tokens = Sampler()(logits, rows).token_ids.tolist()
    assert tokens[0] == 3 and tokens[1] == 2 and tokens[2] not in (2, 3) and tokens[3] == 2


def test_logprobs_are_raw_log_softmax_with_top_n():
    logits = _logits(3)
    rows = [_row(logprobs=5, temperature=0.0), _row(), _row(logprobs=0, seed=3, temperature=0.7,
                                                             repetition_penalty=1.5, prompt=[1])]
    out = Sampler()(logits, rows)
    expected = torch.log_softmax(logits, -1)
    assert out.logprobs[1] is None
    for i in (0, 2):
        entry = out.logprobs[i]
        token = int(out.token_ids[i])
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(float(expected[i, token]), abs=1e-5)
        assert entry.rank == int((expected[i] > expected[i, token]).sum()) + 1
    top = out.logprobs[0].top_logprobs
    assert [t for t, _ in top] == expected[0].topk(5).indices.tolist()
    assert [v for _, v in top] == pytest.approx(expected[0].topk(5).values.tolist(), abs=1e-5)
    assert out.logprobs[0].rank == 1 and out.logprobs[2].top_logprobs == []


def test_mixed_batch_of_every_combination():
    grid = itertools.product((0.0, 0.7, 1.5), (-1, 1, 4, VOCAB + 1), (1.0, 0.5, 1e-3),
                             (0.0, 0.2), (None, 11), (1.0, 1.2), (None, 2))
    rows = [
        _row(temperature=t, top_k=k, top_p=p, min_p=m, seed=s, repetition_penalty=r, logprobs=lp,
             frequency_penalty=0.3, prompt=[1, 2], output=[2, 3], eos=(0,), min_tokens=3)
        for t, k, p, m, s, r, lp in grid
    ]
    logits = _logits(len(rows), seed=5)
    logits[:, ::7] = float("-inf")  # some tokens impossible
    out = Sampler()(logits, rows, torch.Generator().manual_seed(0))
    tokens = out.token_ids
    assert tokens.shape == (len(rows),) and tokens.dtype == torch.int64
    assert bool(((tokens >= 0) & (tokens < VOCAB)).all())
    assert not bool((tokens % 7 == 0).any())  # never an impossible (or min_tokens-blocked) token
    assert all((e is None) == (r.params.logprobs is None) for e, r in zip(out.logprobs, rows))
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    expected = _apply_penalties(logits, rows)[greedy]
    expected[:, 0] = float("-inf")
    assert torch.equal(tokens[greedy], expected.argmax(-1))


def test_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="rows"):
        Sampler()(torch.zeros(2, VOCAB), [_row()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_greedy_without_upcast_equals_float32(dtype):
    """Plain greedy rows take the argmax of the model-dtype logits directly (no float32 copy);
    rows that need probabilities upcast. Both must pick what float32 logits would."""
    logits = (_logits(64, seed=3) * 3).to(dtype)
    plain = [_row(temperature=0.0) for _ in range(64)]
    mixed = [_row(temperature=0.0, logprobs=2) if i % 2 else _row(temperature=0.0)
             for i in range(64)]
    expected = logits.float().argmax(dim=-1)
    for rows in (plain, mixed):
        out = Sampler()(logits, rows)
        assert torch.equal(out.token_ids, expected)
    assert Sampler()(logits, mixed).logprobs[1].token_id == int(expected[1])


def test_tiny_temperatures_are_greedy_and_the_floor_samples_finitely():
    """1e-40 would overflow logits / temperature to inf (NaN after the softmax): below
    MIN_SAMPLING_TEMPERATURE (1e-5) rows are greedy; at the floor, sampling stays finite and
    (with logits this far apart) picks the argmax."""
    logits = _logits(4) * 100  # large logits: what overflows first
    argmax = logits.argmax(-1)
    for temperature in (1e-40, 5e-324, 9e-6):
        out = Sampler()(logits, [_row(temperature=temperature, seed=i) for i in range(4)])
        assert torch.equal(out.token_ids, argmax), temperature
        mixed = [_row(temperature=temperature), _row(temperature=1.0, top_k=3, seed=1),
                 _row(temperature=temperature, min_p=0.1), _row(temperature=temperature)]
        assert torch.equal(Sampler()(logits, mixed).token_ids[[0, 2, 3]], argmax[[0, 2, 3]])
    out = Sampler()(logits, [_row(temperature=1e-5, top_p=0.9, seed=i) for i in range(4)])
    assert torch.equal(out.token_ids, argmax)


def test_top_k_top_p_by_selection_equals_the_full_sort():
    """`apply_top_k_top_p` takes a row's candidates from `topk` where the row has a top-k and
    sorts only the rows with top-p alone: the same logits as sorting every row
    (`_top_k_top_p_sorted`), for batches of every mix (top-k alone, with top-p, top-p alone,
    neither), k from 1 to past a quarter of the vocabulary (the all-sort path), p from tiny
    to 1. Random float logits have no ties, so the kept sets are unique."""
    from pagedrt.engine.logits_processors import _top_k_top_p_sorted, apply_top_k_top_p

    vocab = 97
    gen = torch.Generator().manual_seed(3)
    settings = [(3, 1.0), (1, 1.0), (20, 0.8), (5, 1e-4), (vocab, 0.9), (vocab, 0.3),
                (vocab, 1.0), (30, 1.0)]  # (k, p); k = vocab: no top-k; 30 > vocab // 4
    paths = []
    for trial in range(40):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        picks = torch.randint(0, len(settings) - (trial % 2), (n,), generator=gen).tolist()
        host_k = np.array([settings[i][0] for i in picks])
        host_p = np.array([settings[i][1] for i in picks], dtype=np.float32)
        logits = torch.randn(n, vocab, generator=gen) * 3
        k, p = torch.tensor(host_k)[:, None], torch.tensor(host_p)[:, None]
        got = apply_top_k_top_p(logits, k, p, host_k, host_p)
        want = _top_k_top_p_sorted(logits, k, p)
        assert torch.equal(got, want), (picks, host_k, host_p)
        kept = torch.isfinite(got).sum(dim=1)
        assert (kept >= 1).all() and (kept <= torch.tensor(host_k)).all()
        paths.append(int(host_k[host_k < vocab].max(initial=0)))
    assert any(0 < m <= vocab // 4 for m in paths) and any(m > vocab // 4 for m in paths)
