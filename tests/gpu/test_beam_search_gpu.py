"""Beam search on CUDA (Triton attention, CUDA graphs, async scheduling: the table patch and
the partial-block copies on the device) against the same engine on CPU and HF transformers'
`generate(num_beams=W)` on CPU, fp32, the tiny random-weight Llama with two EOS ids."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from tiny_model import TINY_CONFIG, build_tiny_llama

from pagedrt import LLM, BeamSearchParams, SamplingParams
from pagedrt.bench.common import hf_model_like

EOS = (19, 207)
DEVICE = "cuda"  # (the same checks pass on "cpu": set it to try them without a GPU)


def _tiny(device: str):
    loaded = build_tiny_llama(seed=0, config=dataclasses.replace(TINY_CONFIG, eos_token_ids=EOS))
    return loaded._replace(model=loaded.model.to(device))


def _workload():
    rng = random.Random(5)
    shared = [rng.randrange(384) for _ in range(16)]
    prompts = [shared + [rng.randrange(384) for _ in range(rng.randint(1, 60))]
               for _ in range(12)]
    params = []
    for i in range(len(prompts)):
        if i % 4 == 3:
            params.append(SamplingParams(n=2, temperature=0.0, max_tokens=40, ignore_eos=True))
        else:
            width = (1, 2, 4, 8)[i % 4 + (i // 4) % 2]
            params.append(BeamSearchParams(beam_width=width, max_tokens=40,
                                           length_penalty=(1.0, 0.5, 2.0)[i % 3],
                                           early_stopping=(False, True, "never")[i % 3]
                                           ).to_sampling_params())
    return prompts, params


def _run(device: str, **engine_kwargs):
    prompts, params = _workload()
    llm = LLM(_tiny(device), block_size=16, max_num_seqs=64, **engine_kwargs)
    outs = llm.generate(prompts, params, use_tqdm=False)
    kv = llm.llm_engine.kv_manager
    assert kv.num_free_blocks == kv.num_blocks and not kv.req_to_blocks
    return [[(o.token_ids, o.cumulative_logprob) for o in out.outputs] for out in outs], llm


def _assert_same(got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        assert [t for t, _ in a] == [t for t, _ in b], i
        for (_, x), (_, y) in zip(a, b):
            if x is not None:
                assert x == pytest.approx(y, rel=1e-5, abs=2e-4), i


def test_beam_search_cuda_matches_cpu_and_hf():
    want, _ = _run("cpu", num_kv_blocks=512)
    for async_scheduling in (True, False):
        got, _ = _run(DEVICE, num_kv_blocks=512, async_scheduling=async_scheduling)
        _assert_same(got, want)
    hf = hf_model_like(_tiny("cpu"), torch.float32, torch.device("cpu"))
    prompts, params = _workload()
    for prompt, p, ours in zip(prompts, params, want):
        beam = p.beam_search
        if beam is None or beam.beam_width == 1:
            continue
        ids = torch.tensor([prompt])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=beam.beam_width,
                          num_return_sequences=beam.beam_width, do_sample=False,
                          max_new_tokens=beam.max_tokens, length_penalty=beam.length_penalty,
                          early_stopping=beam.early_stopping, eos_token_id=list(EOS),
                          pad_token_id=EOS[0], output_scores=True, return_dict_in_generate=True)
        for (tokens, _), seq in zip(ours, out.sequences.tolist()):
            gen = seq[len(prompt):]
            ends = [i for i, t in enumerate(gen) if t in EOS]
            assert tokens == (gen[: ends[0] + 1] if ends else gen)


def test_beam_search_cuda_under_preemption():
    """A cache too small for every search: the same beams as with ample memory, on CUDA with
    async scheduling (searches preempted whole and resumed)."""
    want, _ = _run(DEVICE, num_kv_blocks=512)
    got, llm = _run(DEVICE, num_kv_blocks=48, max_num_batched_tokens=256)
    assert llm.stats()["num_preemptions"] > 0
    _assert_same(got, want)


def test_gather_copy_blocks_on_cuda():
    """KVCache.gather_copy_blocks: every destination gets its source as it was before the
    call, in every layer, also where a destination is another pair's source."""
    from pagedrt.kv.kv_cache import KVCache, KVCacheSpec

    spec = KVCacheSpec(3, 2, 64, 16, torch.bfloat16)
    cache = KVCache(spec, num_blocks=10, num_cpu_blocks=0, device=torch.device(DEVICE))
    cache.k_all.normal_()
    cache.v_all.normal_()
    before_k, before_v = cache.k_all.clone(), cache.v_all.clone()
    src = torch.tensor([3, 3, 5, 7], device=DEVICE)
    dst = torch.tensor([5, 6, 7, 9], device=DEVICE)
    cache.gather_copy_blocks(src, dst)
    for s, d in zip(src.tolist(), dst.tolist()):
        assert torch.equal(cache.k_all[:, d], before_k[:, s])
        assert torch.equal(cache.v_all[:, d], before_v[:, s])
    assert torch.equal(cache.k_all[:, [0, 1, 2, 3, 4, 8]], before_k[:, [0, 1, 2, 3, 4, 8]])
    assert cache.k_caches[1].data_ptr() == cache.k_all[1].data_ptr()


@pytest.mark.parametrize("width, num_stops", [(1, 1), (2, 0), (4, 1), (4, 2), (8, 1)])
def test_choice_kernel_equals_torch_ops_on_cuda(width, num_stops):
    """pagedrt/ops/beam_triton.py compiled for the GPU: the same choice and writes as the
    torch ops of `choose_slots` on the same candidates (tests/test_beam_triton.py checks the
    same under the interpreter)."""
    from pagedrt.engine.beam_search import choose_slots, top_candidates
    from pagedrt.ops.beam_triton import beam_choose_triton

    torch.manual_seed(width * 10 + num_stops)
    groups, vocab = 37, 500
    k = max(2, 1 + num_stops) * width
    logits = torch.randn(groups * width, vocab, device=DEVICE) * 3
    logits[:, 7] += 4.0  # an EOS id among the best candidates now and then
    scores = torch.randn(groups * width, device=DEVICE)
    values, flat = top_candidates(logits.bfloat16(), scores, width, k)
    stop = None
    if num_stops:
        stop = torch.tensor([7, 11][:num_stops], device=DEVICE).repeat(groups, 1)
        stop[::3] = -1  # searches that ignore EOS
    want = choose_slots(values, flat, vocab, width, stop)
    n = groups * width + 5
    index = torch.randperm(n, device=DEVICE)[: groups * width].view(groups, width)
    rows = torch.randperm(n + 9, device=DEVICE)[: groups * width].view(groups, width)
    copy_of = torch.full((groups,), -1, device=DEVICE)
    copy_of[1::2] = torch.arange(groups // 2, device=DEVICE)
    dst = torch.randint(0, 10_000, (groups // 2, width), device=DEVICE)
    token_ids = torch.full((n,), -7, device=DEVICE)
    parent_index = torch.full((n,), -7, device=DEVICE)
    beam_scores = torch.zeros(n + 9, device=DEVICE)
    packed, src = beam_choose_triton(values, flat, vocab, stop, index, rows, copy_of, dst,
                                     token_ids, beam_scores, parent_index)
    assert torch.equal(packed, torch.cat([values.view(torch.int32), flat, want.slot_candidates,
                                          want.slot_parents, want.slot_tokens], dim=1))
    assert torch.equal(token_ids[index.view(-1)], want.slot_tokens.view(-1))
    assert torch.equal(beam_scores[rows.view(-1)], want.slot_scores.view(-1))
    assert torch.equal(parent_index[index.view(-1)], index.gather(1, want.slot_parents).view(-1))
    assert torch.equal(src, dst.gather(1, want.slot_parents[1::2]))


@pytest.mark.parametrize("width, k, dtype", [(4, 8, torch.bfloat16), (8, 24, torch.bfloat16),
                                             (2, 4, torch.float32)])
def test_candidate_kernels_equal_torch_ops_on_cuda(width, k, dtype):
    """pagedrt/ops/beam_topk_triton.py compiled for the GPU, at Qwen2's vocabulary (151,936, 75
    chunks) and 64 searches: the K best candidates of `top_candidates`, values within float32
    rounding (tests/test_beam_topk_triton.py checks the same under the interpreter)."""
    from pagedrt.engine.beam_search import top_candidates
    from pagedrt.ops.beam_topk_triton import beam_top_candidates_triton

    torch.manual_seed(width + k)
    groups, vocab = 64, 151_936
    logits = (torch.randn(groups * width, vocab, device=DEVICE) * 4).to(dtype)
    scores = torch.randn(groups * width, device=DEVICE) * 20
    scores[1:width] = -torch.inf  # a search at its first step
    want_values, want_flat = top_candidates(logits, scores, width, k)
    values, flat = beam_top_candidates_triton(logits, scores, width, k)
    torch.testing.assert_close(values, want_values, rtol=1e-6, atol=1e-5)
    cumulative = torch.log_softmax(logits.float(), -1) + scores[:, None]
    torch.testing.assert_close(cumulative.view(groups, -1).gather(1, flat), want_values,
                               rtol=1e-6, atol=1e-5)
    assert all(len(set(row)) == k for row in flat.tolist())
    if dtype == torch.float32:
        assert torch.equal(flat, want_flat)
