"""Beam search's candidate kernels (pagedrt/ops/beam_topk_triton.py) against the torch ops they
replace (`pagedrt.engine.beam_search.top_candidates`), under Triton's CPU interpreter: the same
K best candidates, best first, with values equal up to float32 rounding of the log-sum-exp, on
fresh random logits (widths 1-8, K from W to 3W, vocabularies below, at and past a chunk,
logits in float32, bfloat16 and strided rows, slots without a beam), ties and the contract's
errors (docs/design.md, "Beam search")."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.engine.beam_search import top_candidates
from pagedrt.ops import beam_topk_triton
from pagedrt.ops.beam_topk_triton import beam_top_candidates_triton


@pytest.mark.parametrize("width, k_factor, vocab, dtype", [
    (1, 2, 500, torch.float32),
    (2, 2, 2048, torch.float32),   # exactly one chunk
    (3, 3, 2049, torch.float32),   # one token past it
    (4, 2, 5000, torch.bfloat16),
    (8, 3, 700, torch.float32),
    (4, 1, 4096, torch.float16),   # K = W, two whole chunks
])
def test_candidates_equal_the_torch_ops(width, k_factor, vocab, dtype):
    gen = torch.Generator().manual_seed(width * 1000 + vocab)
    groups = 5
    k = k_factor * width
    logits = (torch.randn(groups * width, vocab, generator=gen) * 4).to(dtype)
    scores = torch.randn(groups * width, generator=gen) * 10
    scores[1:width] = float("-inf")  # search 0's first step: only its slot 0 holds a beam
    want_values, want_flat = top_candidates(logits, scores, width, k)
    values, flat = beam_top_candidates_triton(logits, scores, width, k)
    assert values.dtype == torch.float32 and flat.dtype == torch.int64
    assert values.shape == flat.shape == (groups, k)
    torch.testing.assert_close(values, want_values, rtol=1e-6, atol=1e-5)
    if dtype == torch.float32:  # (no ties)
        assert torch.equal(flat, want_flat)
    else:  # half-precision logits tie often, and topk orders ties its own way: each index
        # holds its value, and none repeats
        cumulative = torch.log_softmax(logits.float(), -1) + scores[:, None]
        torch.testing.assert_close(cumulative.view(groups, -1).gather(1, flat), want_values,
                                   rtol=1e-6, atol=1e-5)
        assert all(len(set(row)) == k for row in flat.tolist())


def test_strided_rows_and_a_small_chunk(monkeypatch):
    """Rows of a wider tensor (the logits of every sampled row, a view per search) and chunks
    of 64 logits, so that K spans several chunks and some chunk has fewer than K tokens."""
    monkeypatch.setattr(beam_topk_triton, "BLOCK", 64)
    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(6, 300, generator=gen) * 3
    logits = wide[:, :250]  # row stride 300
    scores = torch.zeros(6)
    want = top_candidates(logits, scores, 3, 9)
    got = beam_top_candidates_triton(logits, scores, 3, 9)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-5)


def test_ties_go_to_the_lower_flat_index():
    logits = torch.zeros(2, 40)
    logits[:, [5, 9]] = 2.0  # two equal best tokens in each beam, tied across the beams
    values, flat = beam_top_candidates_triton(logits, torch.zeros(2), 2, 5)
    assert flat.tolist() == [[5, 9, 40 + 5, 40 + 9, 0]]
    assert values[0, 0] == values[0, 3] and values[0, 4] < values[0, 3]


def test_no_candidate_twice_when_a_search_has_no_beam():
    """Every slot without a beam (-inf scores, never the case in the engine): K distinct
    indices all the same, each of value -inf."""
    values, flat = beam_top_candidates_triton(torch.randn(2, 30), torch.full((2,), -torch.inf),
                                              2, 4)
    assert len(set(flat[0].tolist())) == 4 and (values == -torch.inf).all()


def test_bad_arguments_name_the_value():
    logits = torch.zeros(6, 10)
    with pytest.raises(ValueError, match="6 logits rows of searches of width 4"):
        beam_top_candidates_triton(logits, torch.zeros(6), 4, 8)
    with pytest.raises(ValueError, match="K=31"):
        beam_top_candidates_triton(logits, torch.zeros(6), 3, 31)
    with pytest.raises(ValueError, match="need float16, bfloat16 or float32"):
        beam_top_candidates_triton(logits.long(), torch.zeros(6), 3, 6)
    with pytest.raises(ValueError, match="scores"):
        beam_top_candidates_triton(logits, torch.zeros(6, dtype=torch.float64), 3, 6)
