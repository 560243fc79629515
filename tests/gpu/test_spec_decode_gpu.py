"""Speculative decoding on CUDA (Triton kernels, CUDA graphs, async scheduling): verification
steps replay the verification graphs (q = k + 1, padded rows), and give the tokens of plain
decoding; rejection sampling keeps the target distribution with device generators.
Run on the H200: python3 -m pytest -m gpu tests/gpu/test_spec_decode_gpu.py"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_spec_decode import (
    _chi2,
    _chi2_bound,
    assert_cache_holds_no_rejected_token,
    assert_no_block_held,
    run,
)
from test_spec_decode_smollm2 import QUESTIONS
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.engine.sampler import SamplingRow
from pagedrt.models.loader import load_model
from pagedrt.spec.rejection_sampler import RejectionSampler


def _on_cuda(loaded):
    return loaded._replace(model=loaded.model.to("cuda"))


def _record_graph_query_lens(llm: LLM) -> list[int]:
    """Wrap the graph runner's replay: the query length of every replay, in order."""
    runner = llm.llm_engine.model_runner.graph_runner
    assert runner is not None and runner.verify_batch_sizes
    seen: list[int] = []
    replay = runner.run

    def recorded(*args, **kwargs):
        seen.append(kwargs.get("query_len", args[5] if len(args) > 5 else 1))
        return replay(*args, **kwargs)

    runner.run = recorded
    return seen


@pytest.mark.parametrize("k", [1, 4])
def test_tiny_draft_equal_to_target_on_cuda_graphs(k, monkeypatch):
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1")
    tiny = _on_cuda(build_tiny_llama(seed=0))
    prompts = [[1, 5, 9, 20, 7], list(range(3, 40)), list(range(100, 164)), [4] * 9]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    cpu = LLM(build_tiny_llama(seed=0), num_kv_blocks=128, block_size=16, max_num_seqs=4)
    expected = [o.outputs[0].token_ids for o in cpu.generate(prompts, params, use_tqdm=False)]
    base = LLM(tiny, num_kv_blocks=128, block_size=16, max_num_seqs=4)
    llm = LLM(tiny, num_kv_blocks=128, block_size=16, max_num_seqs=4, speculative_config={
        "method": "draft_model", "num_speculative_tokens": k, "model": tiny})
    seen = _record_graph_query_lens(llm)
    out = run(llm, prompts, params)
    assert [o.outputs[0].token_ids for o in out] == expected
    assert k + 1 in seen, "no verification graph was replayed"
    s = llm.stats()
    assert s["spec_decode_acceptance_rate"] == 1.0 and s["spec_decode_num_drafts"] > 0
    run(base, prompts, params)
    assert_no_block_held(llm)
    assert_cache_holds_no_rejected_token(llm, out, base)


def _verification_replay_logits(dtype: torch.dtype, form: str, monkeypatch) -> torch.Tensor:
    """Logits of one verification-graph replay on CUDA ([3 * 6, vocab] fp32) of the tiny model
    in `dtype` with PAGEDRT_VERIFY_ATTENTION=form: 3 sequences of q = 6 in the bucket of 4,
    contexts mid-block, at a block boundary and long, over a random history (the same for
    every call: seeded)."""
    from pagedrt.engine.cuda_graphs import CUDAGraphRunner
    from pagedrt.kv.kv_cache import KVCache, KVCacheSpec

    monkeypatch.setenv("PAGEDRT_VERIFY_ATTENTION", form)
    tiny = build_tiny_llama(seed=0)
    model = tiny.model.to("cuda", dtype)
    mc = tiny.model_config
    block_size, q, width, num_blocks = 16, 6, 40, 160
    g = torch.Generator().manual_seed(0)
    contexts = [5, 32, 600]
    tables = torch.randperm(num_blocks, generator=g)[:3 * width].view(3, width)
    tables = tables.to(torch.int32).cuda()
    positions = torch.cat([torch.arange(c, c + q) for c in contexts]).cuda()
    rows = torch.arange(3, device="cuda").repeat_interleave(q)
    slots = (tables[rows, positions // block_size].long() * block_size
             + positions % block_size)
    ids = torch.randint(0, mc.vocab_size, (3 * q,), generator=g).cuda()
    seq_lens = torch.tensor(contexts, dtype=torch.int32, device="cuda") + q
    cache = KVCache(KVCacheSpec.for_model(mc, block_size, dtype), num_blocks, 0,
                    torch.device("cuda"), "auto")
    runner = CUDAGraphRunner(model, cache.layers, max_num_seqs=8, max_blocks_per_seq=width,
                             device=torch.device("cuda"), backend="auto",
                             verify_query_len=q, verify_max_num_seqs=4)
    runner.capture()
    assert runner.verify_as_decode == (form == "decode")
    for layer in cache.layers:  # the history, after the capture's warm-up passes
        layer.k_cache.copy_(torch.randn(layer.k_cache.shape, generator=g))
        layer.v_cache.copy_(torch.randn(layer.v_cache.shape, generator=g))
    return runner.run(ids, positions, slots, seq_lens, tables, q).float().clone()


def test_verification_graph_decode_rows_match_extend_on_cuda(monkeypatch):
    """Replays of the verification graphs give the same logits with per-token decode rows
    (the default) as with the extend kernel: within 1e-4 in fp32; in bf16 both are as far
    from the fp32 logits as rounding makes them (decode rows within 1.5x the extend form's
    error, plus 0.02)."""
    reference = _verification_replay_logits(torch.float32, "extend", monkeypatch)
    rows = _verification_replay_logits(torch.float32, "decode", monkeypatch)
    torch.testing.assert_close(rows, reference, rtol=1e-4, atol=1e-4)
    err = {form: (_verification_replay_logits(torch.bfloat16, form, monkeypatch)
                  - reference).abs().max().item() for form in ("decode", "extend")}
    assert err["decode"] <= 1.5 * err["extend"] + 0.02, err


def test_smollm2_ngram_on_cuda_matches_plain_decoding(smollm2_path, monkeypatch):
    """fp32 on the GPU: n-gram speculation (verification graphs and eager mixed steps) gives
    the greedy tokens of plain decoding, on prompts that repeat their input and not."""
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1")
    loaded = load_model(smollm2_path, torch.float32, torch.device("cuda"))
    base = LLM(loaded, num_kv_blocks=512, block_size=16)
    prompts = [base.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=64)
    ref = run(base, prompts, params)
    for k in (5,):
        llm = LLM(loaded, num_kv_blocks=512, block_size=16, speculative_config={
            "method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4})
        seen = _record_graph_query_lens(llm)
        out = run(llm, prompts, params)
        assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref]
        alone = run(llm, prompts[0], params)[0]
        assert alone.outputs[0].token_ids == ref[0].outputs[0].token_ids
        assert k + 1 in seen
        assert llm.stats()["spec_decode_mean_accepted_length"] > 2.0
        assert_no_block_held(llm)
        assert_cache_holds_no_rejected_token(llm, out, base)


def test_rejection_sampler_distribution_on_cuda():
    g = torch.Generator(device="cuda").manual_seed(5)
    num = 40000
    logits = torch.randn(2, 8, device="cuda", generator=g) * 1.5
    d1 = int(logits[0].argsort()[-2])
    rows = [SamplingRow(SamplingParams(temperature=0.7, top_k=6))] * num
    out = RejectionSampler()(logits.expand(num, 2, 8), rows,
                             torch.full((num, 1), d1, device="cuda"), [1] * num,
                             torch.Generator(device="cuda").manual_seed(0))
    tokens, counts = out.token_ids.cpu().numpy(), out.num_tokens.cpu().numpy()
    scaled = logits / 0.7
    kth = scaled.topk(6, dim=-1).values[:, -1:]
    probs = torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), -1)
    probs = probs.double().cpu().numpy()
    for t in range(2):
        stat, df = _chi2(np.bincount(tokens[counts > t, t], minlength=8), probs[t])
        assert stat < _chi2_bound(df), (t, stat, df)


def test_seeded_sampling_reproducible_on_cuda(monkeypatch):
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1")
    tiny = _on_cuda(build_tiny_llama(seed=0))
    other = _on_cuda(build_tiny_llama(seed=1))
    prompts = [[1, 5, 9, 20, 7], list(range(3, 40))]
    params = [SamplingParams(temperature=1.0, seed=3 + i, max_tokens=32, ignore_eos=True)
              for i in range(2)]
    runs = []
    for _ in range(2):
        llm = LLM(tiny, num_kv_blocks=64, block_size=16, max_num_seqs=4, speculative_config={
            "method": "draft_model", "num_speculative_tokens": 3, "model": other})
        runs.append([o.outputs[0].token_ids for o in run(llm, prompts, params)])
        assert_no_block_held(llm)
    assert runs[0] == runs[1]


def test_speculation_warm_up_runs_at_start_up_on_cuda(monkeypatch):
    """CUDA start-up runs the verification path once (`warm_up_speculation`, after the GEMM
    warm-up and graph capture): it took time and left no row and no block. Run again by hand:
    its first step replays a verification graph (q = k + 1), its second runs eagerly beside a
    prefill chunk, and both verify through the rejection sampler."""
    tiny = _on_cuda(build_tiny_llama(seed=0))
    llm = LLM(tiny, num_kv_blocks=128, block_size=16, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3})
    runner = llm.llm_engine.model_runner
    assert runner.spec_warm_up_s > 0 and runner.gemm_warm_up_s > 0
    assert not runner.batch.row_of
    assert_no_block_held(llm)
    seen = _record_graph_query_lens(llm)
    calls = []
    verify = RejectionSampler.__call__

    def recorded(self, logits, rows, drafts, num_drafts, generator=None):
        calls.append(list(num_drafts))
        return verify(self, logits, rows, drafts, num_drafts, generator)

    monkeypatch.setattr(RejectionSampler, "__call__", recorded)
    runner.warm_up_speculation()
    assert seen == [4] and calls == [[3, 3, 3]] * 2
    assert not runner.batch.row_of
