"""Decode inputs staged for the CUDA graphs (pagedrt/ops/graph_inputs.py and its kernel).

The kernel runs under the interpreter against the torch reference; the host layout is checked
by scattering it back; and whole engines run their decode steps through a graph runner whose
"replays" are eager (capture_graphs=False), with the staged inputs and the in-graph scatter,
against the plain engine: greedy and seeded sampling, async scheduling, padding rows, beam
slots re-parented on the device, input ids gathered into the staged buffer when the
previous step sampled more rows than `last_tokens` holds, speculative decoding switching on
as the batch shrinks, preemption (recompute and swap), and a sliding-window model.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pagedrt import LLM, SamplingParams
from pagedrt.engine.cuda_graphs import CUDAGraphRunner
from pagedrt.ops.graph_inputs import (
    scatter_decode_inputs_reference,
    stage_decode_inputs,
    staged_size,
)

VOCAB = 384

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _step(rng: np.random.Generator, n: int, width: int, num_last: int):
    """Random host arrays of an n-row decode step (some input ids pending)."""
    ids = rng.integers(0, 1000, n)
    positions = rng.integers(0, 500, n)
    slots = rng.integers(-1, 4000, n)
    src = np.where(rng.random(n) < 0.5, rng.integers(0, num_last, n), -1)
    lens = rng.integers(1, 600, n)
    tables = rng.integers(0, 4000, (n, width))
    return ids, positions, slots, src, lens, tables


def _buffers(bs: int, max_blocks: int, fill: int):
    """Static buffers holding stale values (`fill`), as after earlier replays."""
    return (torch.full((bs + 3,), fill, dtype=torch.int64),
            torch.full((bs + 3,), fill, dtype=torch.int64),
            torch.full((bs + 3,), fill, dtype=torch.int64),
            torch.full((bs + 3,), fill, dtype=torch.int32),
            torch.full((bs + 3, max_blocks), fill, dtype=torch.int32))


@pytest.mark.parametrize("n, bs, width, max_blocks", [
    (1, 1, 1, 1), (1, 4, 3, 8), (5, 8, 1, 4), (16, 16, 130, 131), (7, 16, 257, 300),
    (3, 3, 128, 128), (2, 8, 129, 256),
])
def test_kernel_matches_the_reference(n, bs, width, max_blocks):
    """Rows < n from the staged step (pending ids from last_tokens), rows n..bs padding, rows
    past bs and table columns past width untouched; widths around the kernel's 128-column
    tile."""
    from pagedrt.ops.graph_inputs_triton import scatter_decode_inputs

    rng = np.random.default_rng(n * 1000 + width)
    last = torch.from_numpy(rng.integers(0, 1000, 11))
    staged = torch.from_numpy(stage_decode_inputs(*_step(rng, n, width, 11)))
    assert staged.numel() == staged_size(n, width)
    padded = torch.cat([staged, torch.full((5,), 77, dtype=torch.int64)])  # (a longer buffer)
    got, want = _buffers(bs, max_blocks, -5), _buffers(bs, max_blocks, -5)
    scatter_decode_inputs(padded, last, *got, bs)
    scatter_decode_inputs_reference(padded, last, *want, bs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert (got[3][n:bs] == 1).all() and (got[2][n:bs] == -1).all()
    assert (got[0][bs:] == -5).all() and (got[4][:, width:] == -5).all()


@pytest.mark.parametrize("n, width, block_size", [
    (1, 1, 8), (5, 3, 16), (130, 7, 16), (3, 257, 32), (16, 64, 8),
])
def test_advance_kernel_matches_the_reference(n, width, block_size):
    """A multi-step decode's move to the next pass (`advance_decode_inputs`) under the
    interpreter against its torch reference: positions at the end of a block and inside one
    (the slot then from the next table entry, or the same), rows past one program's 128, the
    pending sources set to each row, and nothing past the step's rows written."""
    from pagedrt.ops.graph_inputs import advance_decode_inputs_reference
    from pagedrt.ops.graph_inputs_triton import advance_decode_inputs

    rng = np.random.default_rng(n + width)
    ids, _, slots, src, _, tables = _step(rng, n, width, 4)
    positions = rng.integers(0, width * block_size - 1, n)  # (the next one in the table)
    positions[: n // 2] = (positions[: n // 2] // block_size + 1) * block_size - 1
    positions = np.minimum(positions, width * block_size - 2)
    lens = positions + 1
    flat = torch.from_numpy(stage_decode_inputs(ids, positions, slots, src, lens, tables))
    staged = torch.cat([flat, torch.full((9,), -7, dtype=torch.int64)])
    last = torch.from_numpy(rng.integers(0, 1000, n + 3))
    got, want = staged.clone(), staged.clone()
    tokens_got = torch.full((n + 2,), -5, dtype=torch.int64)
    tokens_want = tokens_got.clone()
    advance_decode_inputs(got, n, width, block_size, last, tokens_got[:n])
    advance_decode_inputs_reference(want, n, width, block_size, last, tokens_want[:n])
    assert torch.equal(got, want) and torch.equal(tokens_got, tokens_want)
    new_positions = positions + 1
    block = tables[np.arange(n), new_positions // block_size]
    assert want[2 + n: 2 + 2 * n].tolist() == new_positions.tolist()
    assert want[2 + 2 * n: 2 + 3 * n].tolist() == (block * block_size
                                                   + new_positions % block_size).tolist()
    assert want[2 + 3 * n: 2 + 4 * n].tolist() == list(range(n))
    assert tokens_want[:n].tolist() == last[:n].tolist()


def test_host_layout_round_trips():
    """Scattering a staged step (reference) gives back the arrays it was built from."""
    rng = np.random.default_rng(3)
    ids, positions, slots, src, lens, tables = _step(rng, 6, 5, 4)
    last = torch.arange(100, 104)
    bufs = _buffers(8, 7, 0)
    scatter_decode_inputs_reference(
        torch.from_numpy(stage_decode_inputs(ids, positions, slots, src, lens, tables)),
        last, *bufs, 8)
    want_ids = np.where(src >= 0, 100 + np.maximum(src, 0), ids)
    assert bufs[0][:6].tolist() == want_ids.tolist()
    assert bufs[1][:6].tolist() == positions.tolist()
    assert bufs[2][:6].tolist() == slots.tolist()
    assert bufs[3][:6].tolist() == lens.tolist()
    assert bufs[4][:6, :5].tolist() == tables.tolist()


@pytest.fixture(autouse=True)
def _staged_on(monkeypatch):
    monkeypatch.setenv("PAGEDRT_STAGED_GRAPH_INPUTS", "1")  # (the default where Triton runs)


def _staged_llm(model, last_tokens_size: int = 0, **kw) -> LLM:
    """An LLM whose decode steps (and verification steps, with speculative decoding) go
    through a graph runner with eager "replays" (async scheduling unless `kw` says)."""
    llm = LLM(model, **{"async_scheduling": True, "num_kv_blocks": 256, "block_size": 8, **kw})
    mr = llm.llm_engine.model_runner
    runner = CUDAGraphRunner(mr.model, mr.kv_cache.layers, mr.max_num_seqs,
                             -(-mr.batch.max_model_len // mr.block_size), mr.device,
                             mr.backend, verify_query_len=mr.num_speculative_tokens + 1,
                             verify_max_num_seqs=mr.spec_max_num_seqs,
                             block_size=mr.block_size, capture_graphs=False,
                             last_tokens_size=last_tokens_size)
    assert runner.staged_inputs, "the staged inputs need Triton (or its interpreter)"
    mr.graph_runner = runner
    return llm


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))] for _ in range(n)]


def _staged_steps(llm: LLM) -> int:
    """Counts the model runner's staged steps from now on."""
    mr = llm.llm_engine.model_runner
    prepare = mr.prepare
    count = [0]

    def counting(*a, **kw):
        inputs = prepare(*a, **kw)
        count[0] += inputs.staged
        return inputs

    mr.prepare = counting
    return count


@pytest.mark.parametrize("last_tokens_size, tight", [(0, False), (2, False), (2, True)])
def test_engine_tokens_match_the_plain_engine(tiny, last_tokens_size, tight):
    """Greedy (plain, and with a penalty) and seeded requests (top-k; top-p, min-p and a
    penalty) of different lengths in mixed batches (batches shrinking through the graph
    buckets, so rows past n are padding), max_num_seqs below the request count (requests
    join mid-decode); last_tokens_size 2: most steps gather their pending ids into the staged
    buffer instead; tight: a staged buffer with no room past the widest step's inputs, so
    that the gather's indices take a copy of their own."""
    prompts = _prompts(5, 12)
    settings = [{"temperature": 0.8, "top_k": 20}, {"temperature": 0.0},
                {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.2},
                {"temperature": 0.0, "presence_penalty": 0.5}]
    params = [SamplingParams(**settings[i % 4], seed=None if i % 2 else i, max_tokens=6 + 3 * i,
                             ignore_eos=True) for i in range(len(prompts))]
    ref = LLM(tiny, async_scheduling=True, num_kv_blocks=256, block_size=8, max_num_seqs=5
              ).generate(prompts, params, use_tqdm=False)
    llm = _staged_llm(tiny, last_tokens_size, max_num_seqs=5)
    if tight:  # (<= 79 tokens a sequence: at most 10 blocks of 8)
        llm.llm_engine.model_runner.graph_runner.staged = torch.zeros(staged_size(5, 10),
                                                                      dtype=torch.int64)
    count = _staged_steps(llm)
    out = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref]
    assert count[0] >= 20
    engine = llm.llm_engine
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_blocks


def test_beam_search_with_staged_inputs(tiny):
    """Beam slots re-parented on the device (the table patch applied to the staged tables)."""
    from pagedrt.sampling_params import BeamSearchParams

    prompts = _prompts(7, 3)
    params = BeamSearchParams(beam_width=3, max_tokens=12, ignore_eos=True)
    ref = LLM(tiny, async_scheduling=True, num_kv_blocks=256, block_size=8
              ).beam_search(prompts, params)
    llm = _staged_llm(tiny)
    count = _staged_steps(llm)
    out = llm.beam_search(prompts, params)
    assert [[s.tokens for s in o.sequences] for o in out] == [
        [s.tokens for s in o.sequences] for o in ref]
    assert count[0] >= 8


def _no_block_leaked(llm: LLM) -> None:
    kv = llm.llm_engine.kv_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_speculative_decoding_with_staged_inputs(tiny):
    """Speculation switched on as the batch shrinks (disable_by_batch_size 2; the target as
    its own draft): staged decode steps while more than two sequences are unfinished, then
    steps that verify drafts through the (eager) verification graphs, which keep the copies;
    greedy, the tokens of the same speculative engine without the graph runner. (A step that
    speculates reads the step in flight first, so no input id is pending across the switch.)"""
    prompts = _prompts(11, 6)
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 4 * i, ignore_eos=True)
              for i in range(len(prompts))]
    spec = {"method": "draft_model", "model": tiny, "num_speculative_tokens": 2,
            "disable_by_batch_size": 2}
    kw = {"speculative_config": spec, "max_num_seqs": 4}
    ref = LLM(tiny, async_scheduling=True, num_kv_blocks=256, block_size=8, **kw
              ).generate(prompts, params, use_tqdm=False)
    llm = _staged_llm(tiny, **kw)
    runner = llm.llm_engine.model_runner.graph_runner
    assert runner.verify_batch_sizes
    count, verified = _staged_steps(llm), [0]
    run = runner.run

    def counting_run(*a, **kw):
        verified[0] += kw.get("query_len", a[5] if len(a) > 5 else 1) > 1
        return run(*a, **kw)

    runner.run = counting_run
    out = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref]
    assert llm.stats()["spec_decode_num_draft_tokens"] > 0
    assert count[0] >= 5 and verified[0] >= 5, (count, verified)
    _no_block_leaked(llm)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_with_staged_inputs(tiny, mode):
    """A cache too small for the batch: sequences are preempted (recomputed or swapped out
    and back) between staged decode steps, so rows leave and return; greedy and seeded rows
    give the tokens of the same engine without the graph runner, and no block is lost."""
    prompts = _prompts(13, 8)
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=None if i % 2 else i,
                             max_tokens=30, ignore_eos=True) for i in range(len(prompts))]
    kw = {"num_kv_blocks": 24, "preemption_mode": mode, "max_num_seqs": 8}
    ref_llm = LLM(tiny, async_scheduling=True, block_size=8, **kw)
    ref = ref_llm.generate(prompts, params, use_tqdm=False)
    llm = _staged_llm(tiny, **kw)
    count = _staged_steps(llm)
    out = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref]
    assert llm.stats()[f"num_preemptions_{mode}"] > 0
    assert count[0] >= 10
    _no_block_leaked(llm)


def test_sliding_window_model_with_staged_inputs(tmp_path):
    """A Mistral whose every layer has a 12-token window: blocks leave the front of each
    block table as the window moves, between staged decode steps; the tokens of the same
    engine without the graph runner, and every block free at the end."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    MistralForCausalLM(MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.1, sliding_window=12)).save_pretrained(tmp_path)
    prompts = _prompts(17, 5)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    kw = {"dtype": "float32", "device": "cpu", "max_num_seqs": 4}
    ref = LLM(str(tmp_path), async_scheduling=True, num_kv_blocks=256, block_size=8, **kw
              ).generate(prompts, params, use_tqdm=False)
    llm = _staged_llm(str(tmp_path), **kw)
    assert llm.llm_engine.kv_manager.sliding_window == 12
    count = _staged_steps(llm)
    out = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref]
    assert count[0] >= 30
    _no_block_leaked(llm)
