"""Decode inputs staged for the CUDA graphs on the GPU (pagedrt/ops/graph_inputs.py): the
kernel compiled, also replayed from a captured graph after its inputs changed, and engines with
the staged inputs against the per-input copies (PAGEDRT_STAGED_GRAPH_INPUTS=0)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.ops.graph_inputs import scatter_decode_inputs_reference, stage_decode_inputs
from pagedrt.sampling_params import BeamSearchParams


def _staged(rng, n, width, num_last):
    return torch.from_numpy(stage_decode_inputs(
        rng.integers(0, 1000, n), rng.integers(0, 500, n), rng.integers(-1, 4000, n),
        np.where(rng.random(n) < 0.5, rng.integers(0, num_last, n), -1),
        rng.integers(1, 600, n), rng.integers(0, 4000, (n, width))))


def test_kernel_in_a_graph_follows_its_staged_inputs():
    from pagedrt.ops.graph_inputs_triton import scatter_decode_inputs

    bs, max_blocks = 16, 300
    staged = torch.zeros(4000, dtype=torch.int64, device="cuda")
    last = torch.zeros(32, dtype=torch.int64, device="cuda")
    bufs = [torch.zeros(bs, dtype=torch.int64, device="cuda") for _ in range(3)] + [
        torch.zeros(bs, dtype=torch.int32, device="cuda"),
        torch.zeros(bs, max_blocks, dtype=torch.int32, device="cuda")]
    scatter_decode_inputs(staged, last, *bufs, bs)  # (compiles outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scatter_decode_inputs(staged, last, *bufs, bs)
    rng = np.random.default_rng(0)
    for n, width in [(16, 1), (3, 257), (9, 128), (1, 5)]:
        step = _staged(rng, n, width, 32)
        staged[: step.numel()].copy_(step)
        last.copy_(torch.from_numpy(rng.integers(0, 1000, 32)))
        graph.replay()
        want = [b.cpu() for b in bufs]
        scatter_decode_inputs_reference(staged.cpu(), last.cpu(), *want, bs)
        for g, w in zip(bufs, want):
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


def _llm(monkeypatch, staged: bool, **kw) -> LLM:
    monkeypatch.setenv("PAGEDRT_STAGED_GRAPH_INPUTS", "1" if staged else "0")
    loaded = build_tiny_llama(seed=0)
    loaded = loaded._replace(model=loaded.model.to("cuda"))
    llm = LLM(loaded, num_kv_blocks=256, block_size=16, max_num_seqs=6, **kw)
    runner = llm.llm_engine.model_runner.graph_runner
    assert runner is not None and runner.staged_inputs == staged
    return llm


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_engine_tokens_staged_against_copied_inputs(monkeypatch, async_scheduling):
    rng = random.Random(0)
    prompts = [[rng.randrange(200) for _ in range(rng.randint(1, 70))] for _ in range(14)]
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=None if i % 2 else i,
                             max_tokens=5 + 4 * i, ignore_eos=True) for i in range(14)]
    outs = {}
    for staged in (False, True):
        llm = _llm(monkeypatch, staged, async_scheduling=async_scheduling)
        outs[staged] = [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                     use_tqdm=False)]
        beams = llm.beam_search(prompts[:3], BeamSearchParams(beam_width=3, max_tokens=20,
                                                              ignore_eos=True))
        outs[staged, "beams"] = [[s.tokens for s in b.sequences] for b in beams]
    assert outs[True] == outs[False]
    assert outs[True, "beams"] == outs[False, "beams"]


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    kv = llm.llm_engine.kv_manager
    assert kv.num_free_blocks == kv.num_blocks  # (no block leaked)
    return out


def test_speculation_and_preemption_staged_against_copied_inputs(monkeypatch):
    """Speculative decoding switching on as the batch shrinks (the target as its own draft,
    disable_by_batch_size 2: staged decode steps, then verification graphs), and a cache too
    small for the batch (preemption by recompute and by swap between staged steps): the same
    tokens with the staged inputs as with the copies."""
    rng = random.Random(1)
    prompts = [[rng.randrange(200) for _ in range(rng.randint(1, 40))] for _ in range(8)]
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=None if i % 2 else i,
                             max_tokens=8 + 4 * i, ignore_eos=True) for i in range(8)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=8 + 4 * i, ignore_eos=True)
              for i in range(8)]
    outs = {}
    for staged in (False, True):
        monkeypatch.setenv("PAGEDRT_STAGED_GRAPH_INPUTS", "1" if staged else "0")
        loaded = build_tiny_llama(seed=0)
        loaded = loaded._replace(model=loaded.model.to("cuda"))
        spec = {"method": "draft_model", "model": loaded, "num_speculative_tokens": 2,
                "disable_by_batch_size": 2}
        llm = LLM(loaded, num_kv_blocks=256, block_size=16, max_num_seqs=6,
                  speculative_config=spec)
        assert llm.llm_engine.model_runner.graph_runner.staged_inputs == staged
        outs[staged, "spec"] = _tokens(llm, prompts, greedy)
        assert llm.stats()["spec_decode_num_draft_tokens"] > 0
        for mode in ("recompute", "swap"):
            llm = LLM(loaded, num_kv_blocks=12, block_size=16, max_num_seqs=6,
                      preemption_mode=mode)
            outs[staged, mode] = _tokens(llm, prompts, params)
            assert llm.stats()[f"num_preemptions_{mode}"] > 0
    for key in ("spec", "recompute", "swap"):
        assert outs[True, key] == outs[False, key], key
