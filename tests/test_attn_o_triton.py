"""The split-K decode attention's combine and the O projection in one kernel
(pagedrt/ops/attn_o_triton.py) against the reduce kernel and F.linear, under the Triton
interpreter on CPU, on partials from the real decode kernel; and the decoder's tokens through
it on the tiny model."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch.nn.functional as F

from pagedrt.models import layers, llama
from pagedrt.ops import attention_triton, gemv_triton
from pagedrt.ops import attn_o_triton as attn_o_module
from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.attention_triton import paged_attention_decode_triton, reduce_partials
from pagedrt.ops.attn_o_triton import CONFIGS, attn_o_triton
from pagedrt.ops.decode_partials import DecodePartials
from pagedrt.sampling_params import SamplingParams

BLOCK_SIZE, HEAD_DIM = 8, 16


def _partials(m: int, num_heads: int, num_kv_heads: int, seq_lens: list[int], num_splits: int,
              dtype: torch.dtype, g: torch.Generator) -> DecodePartials:
    """A split decode launch's partitions over random caches, shuffled block tables."""
    blocks_per_seq = 8
    num_blocks = m * blocks_per_seq + 1
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM, generator=g).to(dtype)
    perm = torch.randperm(num_blocks - 1, generator=g)[: m * blocks_per_seq] + 1
    block_tables = perm.view(m, blocks_per_seq).to(torch.int32)
    query = torch.randn(m, num_heads, HEAD_DIM, generator=g).to(dtype)
    parts = paged_attention_decode_triton(
        query, k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
        HEAD_DIM ** -0.5, num_splits=num_splits, partials=True)
    assert isinstance(parts, DecodePartials) and parts.num_splits == num_splits
    return parts


# (rows, heads, kv heads, contexts, splits): GQA 1, 3 and 8; a context of one token (most
# partitions empty), exactly k * block_size and one past it, the table's full width
CASES = [(1, 4, 4, [1], 8), (2, 6, 2, [16, 17], 4), (3, 8, 1, [64, 9, 33], 2),
         (4, 6, 2, [5, 40, 64, 8], 8)]


@pytest.mark.parametrize("m,heads,kv_heads,seq_lens,splits", CASES,
                         ids=[f"m{c[0]}h{c[1]}kv{c[2]}s{c[4]}" for c in CASES])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_matches_the_reduce_and_the_projection(m, heads, kv_heads, seq_lens, splits,
                                               with_bias):
    """fp32: within 1e-5 of `reduce_partials` then F.linear, for each config; the arrival
    counters left at 0."""
    g = torch.Generator().manual_seed(m * 100 + heads + splits)
    parts = _partials(m, heads, kv_heads, seq_lens, splits, torch.float32, g)
    n = 40
    weight = torch.randn(n, heads * HEAD_DIM, generator=g) / (heads * HEAD_DIM) ** 0.5
    bias = torch.randn(n, generator=g) if with_bias else None
    want = F.linear(reduce_partials(parts).flatten(1), weight, bias)
    for cfg in ((16, 4), CONFIGS[0]):
        torch.testing.assert_close(attn_o_triton(parts, weight, bias, cfg), want, rtol=1e-5,
                                   atol=1e-5)
    assert int(arrival_counters(weight.device, 1).abs().sum()) == 0


def test_half_precision_rounds_the_combined_output_as_the_reduce_does():
    """fp16: the combined heads are rounded to fp16 before the projection, as the reduce
    kernel's output is; within fp16 rounding of the two-kernel chain."""
    g = torch.Generator().manual_seed(7)
    parts = _partials(2, 6, 2, [20, 41], 4, torch.float16, g)
    weight = (torch.randn(24, 6 * HEAD_DIM, generator=g) / 10).to(torch.float16)
    want = F.linear(reduce_partials(parts).flatten(1), weight)
    got = attn_o_triton(parts, weight, None, (16, 4))
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)


def test_an_unsplit_launch_returns_the_output():
    """partials=True asks for the partitions only where the launch splits: one split returns
    the output tensor, as without it."""
    g = torch.Generator().manual_seed(3)
    cache = torch.randn(3, BLOCK_SIZE, 2, HEAD_DIM, generator=g)
    query = torch.randn(1, 4, HEAD_DIM, generator=g)
    args = (query, cache, cache, torch.tensor([[1, 2]], dtype=torch.int32),
            torch.tensor([12], dtype=torch.int32), 0.25)
    out = paged_attention_decode_triton(*args, num_splits=1, partials=True)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, paged_attention_decode_triton(*args, num_splits=1))


def test_bad_inputs_name_what_does_not_fit():
    g = torch.Generator().manual_seed(0)
    parts = _partials(1, 4, 2, [10], 2, torch.float32, g)
    with pytest.raises(ValueError, match=r"weight \(8, 60\) must be \[N, 64\]"):
        attn_o_triton(parts, torch.randn(8, 60))
    with pytest.raises(ValueError, match="must be contiguous"):
        attn_o_triton(parts, torch.randn(64, 8).t())
    with pytest.raises(ValueError, match="torch.float64"):
        attn_o_triton(parts, torch.randn(8, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="bias"):
        attn_o_triton(parts, torch.randn(8, 64), torch.randn(9))
    five = DecodePartials(parts.part_out.expand(5, -1, -1, -1).contiguous(),
                          parts.part_lse.expand(5, -1, -1).contiguous(), 2, torch.float32)
    with pytest.raises(ValueError, match="1 to 4 rows"):
        attn_o_triton(five, torch.randn(8, 64))
    strided = parts._replace(part_out=parts.part_out.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="contiguous fp32"):
        attn_o_triton(strided, torch.randn(8, 64))
    with pytest.raises(ValueError, match="head_dim=12"):
        attn_o_triton(parts._replace(part_out=parts.part_out[..., :12].contiguous()),
                      torch.randn(8, 48))
    with pytest.raises(ValueError, match="bias is torch.float64"):
        attn_o_triton(parts, torch.randn(8, 64), torch.randn(8, dtype=torch.float64))


@pytest.fixture
def attn_o_everywhere(monkeypatch):
    """Decode steps of 1-4 rows take the Triton attention on CPU, split in 4, and hand its
    partitions to the combined kernel (one config); the other small-batch ops keep their chains. Counts the
    combined calls."""
    calls = []

    def forced(key, unfused, fused, *_, **__):
        if key[0] == "attn_o":
            calls.append(key)
            return fused((16, 4))
        return unfused()

    monkeypatch.setattr(layers, "_small_batch_fusion",
                        lambda x, *w: x.dim() == 2 and x.shape[0] <= 4)
    monkeypatch.setattr(llama, "uses_triton", lambda backend, x: True)
    monkeypatch.setattr(gemv_triton, "fused_or_unfused", forced)
    monkeypatch.setattr(attn_o_module, "ENABLED", True)  # (PAGEDRT_FUSED_ATTN_O, opt-in)
    plan = attention_triton.decode_launch_plan

    def four_splits(*args, **kwargs):  # (the CPU's small contexts would not split)
        tuned, warp_tiles, _ = plan(*args, **kwargs)
        return tuned, warp_tiles, 4
    monkeypatch.setattr(attention_triton, "decode_launch_plan", four_splits)
    return calls


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_tokens_through_the_combined_kernel(attn_o_everywhere, monkeypatch, sampling):
    """Decoding 1 and 4 requests with the Triton attention (split in 4) and the combine in the O projection gives the tokens and nearly the
    logprobs of the reduce kernel and the plain projection, greedy and with seeded sampling."""
    from pagedrt.entrypoints.llm import LLM
    from tests.decode_path import mixed_sampling
    from tests.tiny_model import build_tiny_llama

    llm = LLM(build_tiny_llama(seed=0), num_kv_blocks=64, block_size=8,
              attention_backend="triton")
    prompts = [[5, 9, 200, 17], [1, 2, 3], [300, 301, 7, 8, 9, 10], [42]]
    for count in (1, 4):
        params = (SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
                  if sampling == "greedy" else mixed_sampling(count + 1)[1:])
        fused_outs = llm.generate(prompts[:count], params, use_tqdm=False)
        with monkeypatch.context() as mp:
            mp.setattr(attn_o_module, "ENABLED", False)
            plain_outs = llm.generate(prompts[:count], params, use_tqdm=False)
        for f, p in zip(fused_outs, plain_outs, strict=True):
            assert f.outputs[0].token_ids == p.outputs[0].token_ids
            for lf, lp in zip(f.outputs[0].logprobs, p.outputs[0].logprobs, strict=True):
                assert lf.token_id == lp.token_id and abs(lf.logprob - lp.logprob) < 1e-4
    assert {key[2] for key in attn_o_everywhere} == {1, 4}  # both row counts took it
    assert all(key[5] > 1 for key in attn_o_everywhere)  # split launches


def test_tensor_parallel_keeps_the_reduce(monkeypatch):
    """Under tensor parallelism the O projection ends in an all-reduce: no partials."""
    from pagedrt.config import ModelConfig
    from pagedrt.distributed.group import TPGroup
    from pagedrt.ops.attention import AttentionMetadata

    monkeypatch.setattr(layers, "_small_batch_fusion", lambda x, *w: True)
    monkeypatch.setattr(llama, "uses_triton", lambda backend, x: True)
    monkeypatch.setattr(attn_o_module, "ENABLED", True)
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=32, hidden_size=32,
                         intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8)
    one = torch.zeros(1, dtype=torch.int32)
    meta = AttentionMetadata(slot_mapping=one, block_tables=one[None], seq_lens=one,
                             cu_seqlens_q=one, max_query_len=1, max_seq_len=1)
    x = torch.randn(1, 32)
    assert llama.LlamaAttention(config)._attn_o_fusion(x, meta)
    assert not llama.LlamaAttention(config, tp=TPGroup(rank=0, size=2))._attn_o_fusion(x, meta)
