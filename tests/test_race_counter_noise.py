"""The exponential race with its noise drawn in the kernel (PAGEDRT_RACE_COUNTER_NOISE=1,
`sample_triton.race_counter_argmax_triton`) under TRITON_INTERPRET=1: the same tokens as the
race over the noise tensor `philox.counter_draws` gives for the same keys (seeded rows: their
key at their position; other rows: the step's key at their row, stream STREAM_UNSEEDED),
greedy rows their argmax, the draws' distribution the softmax's, and the engine's seeded tokens
unchanged by the switch."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.ops.philox import STREAM_RACE, STREAM_UNSEEDED, counter_draws
from pagedrt.ops.sample_triton import BLOCK, race_argmax_triton, race_counter_argmax_triton


def reference_noise(num_rows, vocab, keys, positions, step_key):
    """[B, V] float32: each row's draws as the kernel's docstring defines them."""
    rows = []
    for b in range(num_rows):
        if positions[b] >= 0:
            key, c1, stream = keys[b], positions[b], STREAM_RACE
        else:
            key, c1, stream = step_key, b, STREAM_UNSEEDED
        rows.append(counter_draws(torch.tensor([key]), torch.tensor([[c1]]), vocab, stream,
                                  exponential=True)[0, 0])
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [37, BLOCK + 1, 2 * BLOCK + 37])
def test_tokens_equal_the_race_over_the_reference_noise(dtype, vocab):
    """Seeded, unseeded and greedy rows at temperatures 0.3 to 2, some tokens masked: the
    tokens of `race_argmax_triton` over the reference noise, row by row."""
    g = torch.Generator().manual_seed(vocab)
    rows = 7
    logits = (torch.randn(rows, vocab, generator=g) * 2).to(dtype)
    logits[:, ::5] = float("-inf")
    temperature = torch.tensor([1.0, 0.3, 2.0, 1.0, 0.7, 1.3, 0.9])
    greedy = torch.tensor([False, False, True, False, False, False, True])
    keys = torch.tensor([0, 12345, 7, (1 << 40) + 3, 99, 0, 5], dtype=torch.int64)
    positions = torch.tensor([-1, 17, 4, 2**31 - 1, -1, 0, -1], dtype=torch.int64)
    step_key = torch.tensor([987654321987], dtype=torch.int64)
    got = race_counter_argmax_triton(logits, temperature, greedy, keys, positions, step_key)
    noise = reference_noise(rows, vocab, keys.tolist(), positions.tolist(), int(step_key))
    expected = race_argmax_triton(logits, noise, temperature, greedy)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected), (got, expected)
    assert torch.equal(got[greedy], logits.float().argmax(-1)[greedy])


def test_unseeded_rows_differ_by_row_and_by_step_key():
    """Flat logits: an unseeded row's token is the argmin of its noise, so rows with the same
    step key draw different tokens, and another step key draws others; a seeded row's token
    does not depend on the step key."""
    vocab, rows = 4096, 8
    logits = torch.zeros(rows, vocab)
    ones = torch.ones(rows)
    greedy = torch.zeros(rows)
    keys = torch.zeros(rows, dtype=torch.int64)
    keys[7] = 42
    positions = torch.full((rows,), -1, dtype=torch.int64)
    positions[7] = 9
    draws = [race_counter_argmax_triton(logits, ones, greedy, keys, positions,
                                        torch.tensor([k], dtype=torch.int64))
             for k in (1, 2)]
    assert len(set(draws[0][:7].tolist())) == 7  # (collisions: ~0.5% for 7 of 4,096)
    assert (draws[0][:7] != draws[1][:7]).sum() >= 6
    assert draws[0][7] == draws[1][7]


def test_draws_follow_the_softmax(monkeypatch):
    """Over 64 rows x 60 step keys of one 8-token distribution, the frequencies of the
    sampled tokens match softmax(logits / T) (chi-square statistic below the 0.999 quantile
    of 7 degrees of freedom, 24.3). (Chunks of 16 logits: the interpreter runs every lane of
    a chunk, 4,096 of them by default.)"""
    from pagedrt.ops import sample_triton

    monkeypatch.setattr(sample_triton, "BLOCK", 16)
    vocab, rows, steps, temperature = 8, 64, 60, 0.8
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
    logits = base.repeat(rows, 1)
    temp = torch.full((rows,), temperature)
    greedy = torch.zeros(rows)
    keys = torch.zeros(rows, dtype=torch.int64)
    positions = torch.full((rows,), -1, dtype=torch.int64)
    counts = np.zeros(vocab)
    for step in range(steps):
        tokens = race_counter_argmax_triton(logits, temp, greedy, keys, positions,
                                            torch.tensor([1000 + step], dtype=torch.int64))
        counts += np.bincount(tokens.numpy(), minlength=vocab)
    expected = torch.softmax(base / temperature, -1).numpy() * rows * steps
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3, (chi2, counts, expected)


def test_bad_arguments_are_value_errors():
    logits = torch.randn(2, 10)
    t, g = torch.ones(2), torch.zeros(2)
    k, p, s = torch.zeros(2, dtype=torch.int64), torch.full((2,), -1), torch.zeros(1).long()
    with pytest.raises(ValueError, match="unit stride"):
        race_counter_argmax_triton(logits.t().contiguous().t(), t, g, k, p, s)
    with pytest.raises(ValueError, match="must be \\[2\\] and step_key \\[1\\]"):
        race_counter_argmax_triton(logits, t, g, k, p, torch.zeros(2).long())
    with pytest.raises(ValueError, match="positions"):
        race_counter_argmax_triton(logits, t, g, k, p[:1], s)
    with pytest.raises(ValueError, match="int64"):
        race_counter_argmax_triton(logits, t, g, k.int(), p, s)
    assert race_counter_argmax_triton(logits[:0], t[:0], g[:0], k[:0], p[:0], s).shape == (0,)


def test_engine_seeded_tokens_do_not_change_with_the_switch(tiny, monkeypatch):
    """The engine through the Triton race with the noise in the kernel gives its seeded rows
    (temperature alone, and top-p through the filtered rows) the tokens of the noise tensor,
    greedy rows beside them too; an unseeded row samples tokens of the vocabulary (no check
    of which: its stream differs); no KV block is left in use."""
    from pagedrt import LLM, SamplingParams

    monkeypatch.setenv("PAGEDRT_SAMPLE_KERNEL", "1")
    prompts = [[1, 5, 9, 20, 7], list(range(3, 30)), [4] * 9, [8, 2, 6],
               list(range(100, 140))]
    params = [SamplingParams(temperature=0.7, seed=11, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=1.3, seed=12, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
              # top-p alone: the filtered full rows, then the race (`_sample_filtered`)
              SamplingParams(temperature=0.9, seed=14, top_p=0.8, max_tokens=10,
                             ignore_eos=True),
              SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)]
    tokens = {}
    for counter in (True, False):
        monkeypatch.setenv("PAGEDRT_RACE_COUNTER_NOISE", "1" if counter else "0")
        llm = LLM(tiny, num_kv_blocks=64, block_size=16)
        assert llm.llm_engine.model_runner.sampler.counter_noise == counter
        outs = llm.generate(prompts, params, use_tqdm=False)
        tokens[counter] = [o.outputs[0].token_ids for o in outs]
        assert llm.llm_engine.scheduler.kv.num_free_blocks == 64
    assert tokens[True][:4] == tokens[False][:4]
    vocab = llm.llm_engine.model_config.vocab_size
    assert len(tokens[True][4]) == 10 and all(0 <= t < vocab for t in tokens[True][4])
