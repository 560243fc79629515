"""The split-K decode attention's combine and the O projection in one kernel on CUDA
(pagedrt/ops/attn_o_triton.py): against the reduce kernel and F.linear in bf16 at Qwen2-0.5B's
and Llama-3-8B's heads, 1 to 4 rows, every config, from the real decode kernel's partitions
(64 splits, as a batch-1 graph splits, most of them empty at a short context); the same bits
on every launch and replay; and the engine's greedy tokens through it against the reduce
(CUDA graphs on, batches of 1 to 4)."""

import pytest
import torch
import torch.nn.functional as F
from forced_op import greedy_tokens_forcing
from tiny_model import build_tiny_llama

from pagedrt.ops import attn_o_triton as attn_o_module
from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.attention_triton import paged_attention_decode_triton, reduce_partials
from pagedrt.ops.attn_o_triton import CONFIGS, attn_o_triton

HEADS = {"qwen2": (14, 2, 64), "llama3": (32, 8, 128)}


def _partials(m: int, heads: tuple, seq_lens: list[int], splits: int = 64):
    num_heads, num_kv_heads, d = heads
    g = torch.Generator(device="cuda").manual_seed(m + num_heads)
    bf16, block_size, width = torch.bfloat16, 16, 256
    num_blocks = m * width + 1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, d, device="cuda",
                          generator=g).to(bf16)
    v_cache = torch.randn_like(k_cache)
    tables = (torch.randperm(num_blocks - 1, device="cuda", generator=g)[: m * width] + 1)
    query = torch.randn(m, num_heads, d, device="cuda", generator=g).to(bf16)
    return paged_attention_decode_triton(
        query, k_cache, v_cache, tables.view(m, width).to(torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32, device="cuda"), d ** -0.5,
        num_splits=splits, partials=True)


@pytest.mark.parametrize("model", HEADS)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_matches_the_reduce_and_the_projection_in_bf16(model, m):
    heads = HEADS[model]
    parts = _partials(m, heads, [512, 4096, 17, 1][:m])
    hidden = heads[0] * heads[2]
    g = torch.Generator(device="cuda").manual_seed(m)
    weight = (torch.randn(hidden, hidden, device="cuda", generator=g) / hidden ** 0.5).to(
        torch.bfloat16)
    want = F.linear(reduce_partials(parts).flatten(1), weight).float()
    for cfg in CONFIGS:
        got = attn_o_triton(parts, weight, None, cfg).float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert int(arrival_counters(weight.device, 1).abs().sum()) == 0


def test_same_bits_on_every_launch_and_replay():
    parts = _partials(2, HEADS["qwen2"], [512, 37])
    weight = (torch.randn(896, 896, device="cuda") / 30).to(torch.bfloat16)
    first = attn_o_triton(parts, weight, None, CONFIGS[1])
    for _ in range(10):
        assert torch.equal(attn_o_triton(parts, weight, None, CONFIGS[1]), first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attn_o_triton(parts, weight, None, CONFIGS[1])
    for _ in range(10):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, first)


def test_engine_tokens_through_the_combined_kernel(monkeypatch):
    """fp32 tiny model: with the combined kernel forced wherever a 1-4-row decode splits
    (inside the CUDA graphs), the greedy tokens of 1 and 4 requests are the reduce's."""
    loaded = build_tiny_llama(seed=0)
    loaded = loaded._replace(model=loaded.model.to("cuda"))
    combined, forced = greedy_tokens_forcing(monkeypatch, loaded, "attn_o", CONFIGS[1],
                                             [(attn_o_module, "ENABLED", True)])
    reduced, _ = greedy_tokens_forcing(monkeypatch, loaded, "attn_o", CONFIGS[1],
                                       [(attn_o_module, "ENABLED", False)])
    assert forced, "no decode step split and took the combined kernel"
    assert combined == reduced
