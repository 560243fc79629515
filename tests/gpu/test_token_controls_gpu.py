"""Prompt logprobs, logit_bias, allowed_token_ids and bad words on CUDA (Triton kernels, CUDA
graphs for the decode steps, the batched sampler) against the same engine on CPU (torch
reference path), fp32, tiny random-weight Llama: the same greedy tokens, and prompt logprobs
equal within fp32 round-off (same prompt tokens, ranks and top ids)."""

import pytest
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams

PROMPTS = [list(range(3, 40)), [1, 5, 9, 20, 7], list(range(100, 164)), [42]]


def _on(device: str):
    loaded = build_tiny_llama(seed=0)
    return loaded._replace(model=loaded.model.to(device))


def _params() -> list[SamplingParams]:
    greedy = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
    return [SamplingParams(prompt_logprobs=5, logprobs=2, **greedy),
            SamplingParams(logit_bias={7: 100.0, 8: -100.0}, **greedy),
            SamplingParams(allowed_token_ids=[11, 12, 13, 250], prompt_logprobs=0, **greedy),
            SamplingParams(**greedy)]


def _run(device: str, max_num_batched_tokens: int):
    llm = LLM(_on(device), num_kv_blocks=64, block_size=16, max_num_seqs=4,
              max_num_batched_tokens=max_num_batched_tokens)
    return llm.generate(PROMPTS, _params(), use_tqdm=False)


@pytest.mark.parametrize("max_num_batched_tokens", [32, 512])  # chunked prompts, whole ones
def test_token_controls_cuda_match_cpu(max_num_batched_tokens):
    cpu = _run("cpu", max_num_batched_tokens)
    cuda = _run("cuda", max_num_batched_tokens)
    for c, g in zip(cpu, cuda):
        assert g.outputs[0].token_ids == c.outputs[0].token_ids
    assert set(cuda[2].outputs[0].token_ids) <= {11, 12, 13, 250}
    for i in (0, 2):
        want, got = cpu[i].prompt_logprobs, cuda[i].prompt_logprobs
        assert len(got) == len(PROMPTS[i]) and got[0] is None
        for w, g in zip(want[1:], got[1:]):
            assert (g.token_id, g.rank) == (w.token_id, w.rank)
            assert g.logprob == pytest.approx(w.logprob, abs=1e-3)
            assert [t for t, _ in g.top_logprobs] == [t for t, _ in w.top_logprobs]
    assert cuda[1].prompt_logprobs is None and cuda[3].prompt_logprobs is None


def test_bad_words_cuda_match_cpu():
    """Bad-word sequences on CUDA (the batched sampler's bans by index_put, the token still
    being sampled compared on the device under async scheduling) against the CPU engine: a
    one-token word and a two-token one taken from the unconstrained greedy output, so the
    bans change it; the same tokens on both, and neither word generated."""
    greedy = {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True}
    free = LLM(_on("cpu"), num_kv_blocks=64, block_size=16).generate(
        PROMPTS, SamplingParams(**greedy), use_tqdm=False)
    out = free[2].outputs[0].token_ids
    single, pair = out[0], out[3:5]
    params = SamplingParams(bad_words_token_ids=[[single], list(pair)], **greedy)
    runs = [LLM(_on(device), num_kv_blocks=64, block_size=16, max_num_seqs=4).generate(
        PROMPTS, params, use_tqdm=False) for device in ("cpu", "cuda")]
    for c, g in zip(*runs):
        tokens = g.outputs[0].token_ids
        assert tokens == c.outputs[0].token_ids
        assert single not in tokens
        assert all(tuple(tokens[i:i + 2]) != tuple(pair) for i in range(len(tokens) - 1))
    assert runs[1][2].outputs[0].token_ids != out
