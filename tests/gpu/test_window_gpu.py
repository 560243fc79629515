"""Sliding window on CUDA: the compiled Triton kernels (bf16, long contexts, the shapes of
Mistral-7B and Gemma 3) against the torch reference, and the engine on CUDA (kernels, CUDA
graphs, fused RoPE) against the engine on CPU for windowed tiny models, fp32 greedy tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_model import TINY_CONFIG, build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.ops import attention_reference as ref

CUDA = torch.device("cuda")


def windowed_cache(seq_lens, q_lens, window, num_kv_heads, head_dim, block_size=16,
                   dtype=torch.bfloat16):
    """K/V in shuffled blocks; NaN before each sequence's first-query window (and its blocks'
    table entries pointing at a NaN block) and past its end."""
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=CUDA).to(dtype)
    v_cache = torch.randn(shape, device=CUDA).to(dtype)
    perm = torch.randperm(num_blocks, device=CUDA)
    nan_block = int(perm[-1])
    k_cache[nan_block] = v_cache[nan_block] = float("nan")
    table = torch.full((len(seq_lens), max(blocks)), nan_block, dtype=torch.int32, device=CUDA)
    used = 0
    for i, (n, q, nb) in enumerate(zip(seq_lens, q_lens, blocks)):
        ids = perm[used:used + nb].clone()
        used += nb
        first_seen = max(n - q - window + 1, 0)
        flat_k = k_cache[ids].flatten(0, 1)
        flat_v = v_cache[ids].flatten(0, 1)
        flat_k[:first_seen] = flat_v[:first_seen] = float("nan")
        flat_k[n:] = flat_v[n:] = float("nan")
        k_cache[ids] = flat_k.view(nb, block_size, num_kv_heads, head_dim)
        v_cache[ids] = flat_v.view(nb, block_size, num_kv_heads, head_dim)
        ids[: first_seen // block_size] = nan_block
        table[i, :nb] = ids.int()
    return k_cache, v_cache, table, torch.tensor(seq_lens, dtype=torch.int32, device=CUDA)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(32, 8, 128), (4, 1, 256)],
                         ids=["mistral-7b", "gemma3"])
@pytest.mark.parametrize("window", [4095, 512])  # mid-block; 32 blocks of 16
def test_decode_kernel_long_context(heads, kv_heads, head_dim, window):
    from pagedrt.ops.attention_triton import paged_attention_decode_triton

    torch.manual_seed(window)
    lens = [1, 511, 4097, 32768]  # the window longer than the context, and much shorter
    k, v, table, seq_lens = windowed_cache(lens, [1] * len(lens), window, kv_heads, head_dim)
    query = torch.randn(len(lens), heads, head_dim, device=CUDA).bfloat16()
    expected = ref.paged_attention_decode_reference(query, k, v, table, seq_lens, 0.1, window)
    for num_splits in (None, 1, 8):
        out = paged_attention_decode_triton(query, k, v, table, seq_lens, 0.1,
                                            num_splits=num_splits, sliding_window=window)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=0)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(32, 8, 128), (4, 1, 256)],
                         ids=["mistral-7b", "gemma3"])
@pytest.mark.parametrize("window", [4096, 1000])
def test_extend_kernel_chunks(heads, kv_heads, head_dim, window):
    from pagedrt.ops.attention_extend_triton import paged_attention_extend_triton

    torch.manual_seed(window + head_dim)
    pairs = [(0, 6000), (5000, 2048), (123, 1), (8191, 700)]  # (cached, new) per sequence
    lens, q_lens = [c + q for c, q in pairs], [q for _, q in pairs]
    k, v, table, seq_lens = windowed_cache(lens, q_lens, window, kv_heads, head_dim)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=CUDA)
    query = torch.randn(sum(q_lens), heads, head_dim, device=CUDA).bfloat16()
    expected = ref.paged_attention_extend_reference(query, k, v, table, cu, seq_lens, 0.1,
                                                    window)
    out = paged_attention_extend_triton(query, k, v, table, cu, seq_lens, 0.1,
                                        sliding_window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=0)


WINDOWED = dataclasses.replace(TINY_CONFIG, architecture="MistralForCausalLM",
                               sliding_window=24, layer_types=("sliding_attention",) * 2)
GEMMA3 = dataclasses.replace(
    TINY_CONFIG, architecture="Gemma3ForCausalLM", qk_norm=True, sliding_window=24,
    layer_types=("sliding_attention", "full_attention"), rope_local_theta=10000.0,
    rope_theta=1e6, query_pre_attn_scalar=16, tie_word_embeddings=True)


@pytest.mark.parametrize("config, small", [(WINDOWED, 9), (GEMMA3, 12)],
                         ids=["all-windowed", "gemma3"])
def test_windowed_engine_cuda_matches_cpu(config, small):
    """Prompts longer than the window, shared prefixes (prefix hits), a cache of `small`
    blocks that preempts (on CPU, 2 and 5 preemptions): the same greedy tokens on CUDA as on
    the CPU reference path."""
    prompts = [list(range(3, 90)), list(range(3, 60)) + [7] * 20, [5, 9, 1]]
    prompts.append(list(range(200, 330)))
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    outs = {}
    for device in ("cpu", "cuda"):
        loaded = build_tiny_llama(seed=2, config=config)
        loaded = loaded._replace(model=loaded.model.to(device))
        for blocks in (64, small):
            llm = LLM(loaded, num_kv_blocks=blocks, block_size=16, max_num_batched_tokens=64)
            outs[device, blocks] = [o.outputs[0].token_ids for o in
                                    llm.generate(prompts, params, use_tqdm=False)]
            llm.llm_engine.check_integrity()
            kv = llm.llm_engine.kv_manager
            assert kv.num_free_blocks == kv.num_blocks
    assert outs["cuda", 64] == outs["cpu", 64] == outs["cpu", small] == outs["cuda", small]
