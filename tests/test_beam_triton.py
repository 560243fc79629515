"""The beam-search choice kernel (pagedrt/ops/beam_triton.py) against the torch ops it replaces
(`pagedrt.engine.beam_search.choose_slots` and the beam runner's writes), under Triton's CPU
interpreter: every output equal, on random candidates (widths 1-8, EOS ids per search or none,
parents spread or all the same, partial-block copies for some searches), and an engine whose
beam searches choose with it equal to one whose searches choose with torch ops (docs/design.md,
"Beam search")."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import dataclasses
import random

import pytest
import torch
from tiny_model import TINY_CONFIG, build_tiny_llama

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt import LLM, BeamSearchParams, SamplingParams
from pagedrt.engine.beam_search import choose_slots
from pagedrt.ops import beam_triton


def random_candidates(rng: random.Random, num_groups: int, width: int, vocab: int,
                      num_candidates: int, stop_ids: list[int], same_parent: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """values [G, K] descending, flat [G, K] distinct indices into W x V; with same_parent,
    the best candidates all come from one beam; a third of the searches lead with an EOS."""
    values = torch.sort(torch.randn(num_groups, num_candidates), dim=1, descending=True).values
    flat = []
    for _ in range(num_groups):
        cells = list(range(width * vocab))
        rng.shuffle(cells)
        if same_parent:
            beam = rng.randrange(width)
            cells.sort(key=lambda x: x // vocab != beam)  # that beam's tokens first
        if stop_ids and rng.random() < 0.35:
            eos = rng.randrange(width) * vocab + rng.choice(stop_ids)
            cells.remove(eos)
            cells.insert(0, eos)
        flat.append(cells[:num_candidates])
    return values, torch.tensor(flat)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("num_stops", [0, 1, 2])
def test_kernel_equals_torch_ops(width, num_stops):
    rng = random.Random(width * 10 + num_stops)
    torch.manual_seed(width * 10 + num_stops)
    vocab = 11
    for trial in range(6):
        num_groups = rng.randint(1, 7)
        k = max(2, 1 + num_stops) * width
        stop_ids = rng.sample(range(vocab), num_stops)
        values, flat = random_candidates(rng, num_groups, width, vocab, k, stop_ids,
                                         same_parent=trial % 2 == 0)
        stop = None
        if num_stops:  # some searches ignore EOS (-1)
            stop = torch.tensor([stop_ids if rng.random() < 0.7 else [-1] * num_stops
                                 for _ in range(num_groups)])
        want = choose_slots(values, flat, vocab, width, stop)
        num_sampled = num_groups * width + 3
        index = torch.randperm(num_sampled)[: num_groups * width].view(num_groups, width)
        rows = torch.randperm(num_sampled + 5)[: num_groups * width].view(num_groups, width)
        copied = sorted(rng.sample(range(num_groups), rng.randint(0, num_groups)))
        copy_of = torch.full((num_groups,), -1)
        copy_of[copied] = torch.arange(len(copied))
        dst = torch.randint(0, 1000, (len(copied), width))
        token_ids = torch.full((num_sampled,), -7)
        parent_index = torch.full((num_sampled,), -7)
        scores = torch.full((num_sampled + 5,), 9.0)
        packed, src = beam_triton.beam_choose_triton(values, flat, vocab, stop, index, rows,
                                                     copy_of, dst, token_ids, scores,
                                                     parent_index)
        assert torch.equal(packed, torch.cat([values.view(torch.int32), flat,
                                              want.slot_candidates, want.slot_parents,
                                              want.slot_tokens], dim=1))
        assert torch.equal(token_ids[index.view(-1)], want.slot_tokens.view(-1))
        assert torch.equal(scores[rows.view(-1)], want.slot_scores.view(-1))
        assert torch.equal(parent_index[index.view(-1)],
                           index.gather(1, want.slot_parents).view(-1))
        assert torch.equal(src, dst.gather(1, want.slot_parents[copied]))
        untouched = torch.ones(num_sampled, dtype=torch.bool)
        untouched[index.view(-1)] = False
        assert (token_ids[untouched] == -7).all() and (parent_index[untouched] == -7).all()


def test_kernel_rejects_bad_shapes():
    values, flat = torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.int64)
    index = torch.zeros(2, 2, dtype=torch.int64)
    empty = torch.zeros(0, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="flat is"):
        beam_triton.beam_choose_triton(values, flat.int(), 8, None, index, index,
                                       torch.full((2,), -1), empty, flat, values, flat)
    with pytest.raises(ValueError, match="K=4, W=5"):
        wide = torch.zeros(2, 5, dtype=torch.int64)
        beam_triton.beam_choose_triton(values, flat, 8, None, wide, wide,
                                       torch.full((2,), -1), empty, flat, values, flat)


def test_engine_with_the_kernel_equals_the_torch_choice(monkeypatch, scheduling):
    """Beam searches of widths 2 and 3 with two EOS ids (some hypotheses end early), sharing
    steps with a sampled request, in an engine on the Triton backend (interpreted): the same
    beams and scores whether the candidates and the choice come from the kernels or from torch
    ops."""
    model = build_tiny_llama(seed=0, config=dataclasses.replace(TINY_CONFIG,
                                                                eos_token_ids=(19, 207)))
    rng = random.Random(3)
    prompts = [[rng.randrange(384) for _ in range(rng.randint(3, 20))] for _ in range(3)]
    params = [BeamSearchParams(beam_width=w, max_tokens=10).to_sampling_params()
              for w in (2, 3, 2)] + [SamplingParams(temperature=0.0, max_tokens=10)]
    calls = []
    kernel = beam_triton.beam_choose_triton

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(beam_triton, "beam_choose_triton", counted)
    results = {}
    for use_kernel in ("1", "0"):
        monkeypatch.setenv("PAGEDRT_BEAM_KERNEL", use_kernel)
        llm = LLM(model, num_kv_blocks=256, block_size=8, attention_backend="triton")
        outs = llm.generate(prompts + [prompts[0]], params, use_tqdm=False)
        results[use_kernel] = [[(o.token_ids, o.cumulative_logprob) for o in out.outputs]
                               for out in outs]
        if use_kernel == "1":
            assert len(calls) >= 9, "the kernel did not run every step"
            num_calls = len(calls)
        else:
            assert len(calls) == num_calls, "the kernel ran with PAGEDRT_BEAM_KERNEL=0"
    # the same beams; scores equal up to the candidate kernels' float32 rounding of the
    # log-sum-exp (pagedrt/ops/beam_topk_triton.py)
    for got, want in zip(results["1"], results["0"]):
        assert [t for t, _ in got] == [t for t, _ in want]
        for (_, a), (_, b) in zip(got, want):
            assert (a is None) == (b is None)
            assert a is None or a == pytest.approx(b, rel=1e-6, abs=1e-5)
    assert any(len(o[0]) < 10 for out in results["1"][:3] for o in out), "no early EOS"
