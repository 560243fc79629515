"""The Triton exponential race on CUDA against the torch ops (pagedrt/ops/sample_triton.py), at
Qwen2's vocabulary and 256 rows, and through the engine's batched sampler.
Run on the H200: python3 -m pytest -m gpu tests/gpu/test_sample_triton_gpu.py"""

from __future__ import annotations

import pytest
import torch

from pagedrt.ops.sample_triton import race_argmax_triton

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_race_at_qwen2_vocab_matches_torch(dtype):
    """256 rows of 151,936 logits, mixed greedy and sampled at several temperatures: at most
    one row in a thousand may differ (float32 rounding at a near-tie; in practice none)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, vocab = 256, 151936
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 4).to(dtype)
    noise = torch.empty(rows, vocab, device="cuda").exponential_(generator=g)
    temperature = torch.rand(rows, device="cuda", generator=g) * 1.5 + 0.2
    greedy = torch.rand(rows, device="cuda", generator=g) < 0.25
    got = race_argmax_triton(logits, noise, temperature, greedy)
    x = logits.float()
    probs = torch.softmax(x / temperature[:, None], dim=-1)
    sampled = (probs / noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(-1)
    expected = torch.where(greedy, x.argmax(-1), sampled)
    assert (got != expected).sum().item() <= rows // 1000, (got != expected).nonzero()
    assert torch.equal(got[greedy], x.argmax(-1)[greedy])


def test_sampling_frequencies_follow_the_softmax():
    """One row's logits over 8 tokens, 200,000 draws of the race at temperature 0.7: the
    frequencies are the softmax's within 0.005."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5], device="cuda")
    n = 200_000
    batch = logits.expand(n, 8).contiguous()
    noise = torch.empty(n, 8, device="cuda").exponential_()
    tokens = race_argmax_triton(batch, noise, torch.full((n,), 0.7, device="cuda"),
                                torch.zeros(n, dtype=torch.bool, device="cuda"))
    freq = torch.bincount(tokens, minlength=8).float() / n
    torch.testing.assert_close(freq, torch.softmax(logits / 0.7, -1), atol=5e-3, rtol=0)


def test_top_k_top_p_by_selection_at_qwen2_vocab():
    """The batched sampler's top-k/top-p filter (`topk` candidates where a row has a top-k,
    a sort for rows with top-p alone) against sorting every row, on CUDA at 256 x 151,936:
    the same logits kept, for the "filters" setting of `bench throughput` (k 20, p 0.9) mixed
    with rows of top-p alone, top-k alone and neither."""
    import numpy as np

    from pagedrt.engine.logits_processors import _top_k_top_p_sorted, apply_top_k_top_p

    g = torch.Generator(device="cuda").manual_seed(1)
    rows, vocab = 256, 151936
    logits = torch.randn(rows, vocab, device="cuda", generator=g) * 4
    kinds = [(20, 0.9), (vocab, 0.95), (50, 1.0), (vocab, 1.0)]
    host_k = np.array([kinds[i % 4][0] for i in range(rows)])
    host_p = np.array([kinds[i % 4][1] for i in range(rows)], dtype=np.float32)
    k = torch.tensor(host_k, device="cuda")[:, None]
    p = torch.tensor(host_p, device="cuda")[:, None]
    got = apply_top_k_top_p(logits, k, p, host_k, host_p)
    want = _top_k_top_p_sorted(logits, k, p)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert torch.equal(got[torch.isfinite(got)], want[torch.isfinite(want)])
    unfiltered = torch.as_tensor((host_k >= vocab) & (host_p >= 1), device="cuda")
    assert torch.equal(got[unfiltered], logits[unfiltered])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 8, 64, 256])
def test_split_argmax_and_race_at_qwen2_vocab(dtype, rows):
    """PAGEDRT_SAMPLE_SPLIT's kernels on CUDA (pagedrt/ops/sample_triton.py, "Split rows") at
    151,936 logits with the splits chosen for this GPU: `argmax_triton` gives torch.argmax's
    tokens (a maximum tied across two spans in row 0, the lower one), and the split race the
    unsplit race's; twice each, so the arrival counters reset by one launch serve the next."""
    from pagedrt.ops.sample_triton import argmax_triton, sample_splits
    from pagedrt.ops.triton_utils import device_sms

    g = torch.Generator(device="cuda").manual_seed(rows)
    vocab = 151936
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 4).to(dtype)
    logits[0, 5000] = logits[0, 140000] = 100.0
    splits = sample_splits(rows, vocab, device_sms(logits))
    assert splits > 1
    noise = torch.empty(rows, vocab, device="cuda").exponential_(generator=g)
    temperature = torch.rand(rows, device="cuda", generator=g) * 1.5 + 0.2
    greedy = torch.rand(rows, device="cuda", generator=g) < 0.25
    for _ in range(2):
        got = argmax_triton(logits)
        assert torch.equal(got, logits.argmax(-1)) and int(got[0]) == 5000
        assert torch.equal(race_argmax_triton(logits, noise, temperature, greedy, splits),
                           race_argmax_triton(logits, noise, temperature, greedy))
