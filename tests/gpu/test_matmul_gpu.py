"""The tiled decode matmul on CUDA (pagedrt/ops/matmul_triton.py): every candidate config in
bf16 against cuBLAS on the Qwen2-0.5B and Llama-3-8B decode GEMMs (with and without bias), and
split-K configs in a replayed CUDA graph, the QKV + RoPE epilogue
(pagedrt/ops/matmul_rope_triton.py) against the matmul and the rotary kernel, and the engine's
greedy tokens with the path on (a whole-K and a split-K config) and off (CUDA graphs, batches
of 8 and 16)."""

import pytest
import torch
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.ops import matmul_triton
from pagedrt.ops.matmul_triton import CONFIGS

SHAPES = {"qwen2": (896, 1152, 9728, 4864), "llama3": (4096, 6144, 28672, 14336)}


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("m", [8, 48, 64])
def test_configs_match_cublas_in_bf16(model, m):
    """QKV (with bias), gate/up, O, the down projection (the longest K loop) and a K that no
    BLOCK_K divides."""
    hidden, qkv, gate_up, inter = SHAPES[model]
    g = torch.Generator(device="cuda").manual_seed(m)
    dev, bf16 = "cuda", torch.bfloat16
    for n, k, with_bias in ((qkv, hidden, True), (gate_up, hidden, False),
                            (hidden, hidden, False), (hidden, inter, False),
                            (hidden, hidden + 40, False)):
        x = torch.randn(m, k, device=dev, generator=g).to(bf16)
        w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(bf16)
        b = (torch.randn(n, device=dev, generator=g) * 0.02).to(bf16) if with_bias else None
        want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
        for cfg in CONFIGS:
            got = matmul_triton.matmul_triton(x, w, b, cfg).float()
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


SPLIT_CONFIGS = [(16, 64, 128, 4, 4, True, 4), (64, 64, 64, 4, 3, False, 3),
                 (32, 128, 64, 4, 4, True, 8)]


@pytest.mark.parametrize("m", [8, 64, 256])
def test_split_k_matches_cublas_in_a_replayed_graph(m):
    """Split-K configs at Qwen2-0.5B's down (K = 4,864) and QKV (bias) shapes: three launches
    captured in one CUDA graph, replayed three times: each replay equals the eager result bit
    for bit (the counters are back at 0 after every launch) and cuBLAS within bf16 rounding."""
    from pagedrt.ops.arrival_counters import _COUNTERS

    g = torch.Generator(device="cuda").manual_seed(m)
    dev, bf16 = "cuda", torch.bfloat16
    for n, k, with_bias in ((896, 4864, False), (1152, 896, True)):
        x = torch.randn(m, k, device=dev, generator=g).to(bf16)
        w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(bf16)
        b = (torch.randn(n, device=dev, generator=g) * 0.02).to(bf16) if with_bias else None
        want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
        eager = [matmul_triton.matmul_triton(x, w, b, c) for c in SPLIT_CONFIGS]
        for got in eager:
            torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
        graph, outs = torch.cuda.CUDAGraph(), []
        with torch.cuda.graph(graph):
            outs = [matmul_triton.matmul_triton(x, w, b, c) for c in SPLIT_CONFIGS]
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(o, e) for o, e in zip(outs, eager, strict=True))
    assert int(_COUNTERS[torch.device("cuda", 0)].abs().sum()) == 0


@pytest.mark.parametrize("m", [8, 64, 128, 256])
def test_silu_mul_matches_the_plain_path_in_bf16(m):
    """Gate/up with SwiGLU's activation in the epilogue, every SILU_CONFIGS config, at Qwen2-0.5B's
    and Llama-3-8B's gate/up shapes, against the plain path (cuBLAS, then the activation
    kernel): equal within bf16 rounding of the products (the two sum in different orders).
    256 rows as PAGEDRT_MATMUL_FUSED_MAX_ROWS=256 runs it."""
    from pagedrt.ops.fused_triton import silu_and_mul_triton

    g = torch.Generator(device="cuda").manual_seed(m)
    for hidden, gate_up, _, _ in (SHAPES["qwen2"], SHAPES["llama3"]):
        x = torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(gate_up, hidden, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        plain = silu_and_mul_triton(torch.nn.functional.linear(x, w)).float()
        for cfg in matmul_triton.SILU_CONFIGS:
            got = matmul_triton.matmul_triton(x, w, None, cfg, silu_mul=True).float()
            torch.testing.assert_close(got, plain, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("model", ["qwen2", "llama3"])
@pytest.mark.parametrize("m", [8, 64, 128, 256])
def test_qkv_rope_matches_the_chain_in_bf16(monkeypatch, model, m):
    """Every candidate of the QKV + RoPE epilogue at Qwen2-0.5B's heads (14 + 2 x 2 of 64,
    bias) and Llama-3-8B's (32 + 2 x 8 of 128): the qkv rows and both caches against cuBLAS and
    `rotary_write_kv_triton`, with padding rows (slot -1) that must leave the cache alone.
    256 rows as PAGEDRT_MATMUL_FUSED_MAX_ROWS=256 allows."""
    from pagedrt.models.layers import RotaryEmbedding
    from pagedrt.ops.fused_triton import rotary_write_kv_triton
    from pagedrt.ops.matmul_rope_triton import CONFIGS as ROPE_CONFIGS
    from pagedrt.ops.matmul_rope_triton import matmul_qkv_rope_triton

    monkeypatch.setattr(matmul_triton, "FUSED_MAX_ROWS", 256)
    hidden, heads, kv_heads, d, with_bias = {"qwen2": (896, 14, 2, 64, True),
                                             "llama3": (4096, 32, 8, 128, False)}[model]
    g = torch.Generator(device="cuda").manual_seed(m + d)
    dev, bf16 = "cuda", torch.bfloat16
    n, block_size = (heads + 2 * kv_heads) * d, 16
    x = torch.randn(m, hidden, device=dev, generator=g).to(bf16)
    w = (torch.randn(n, hidden, device=dev, generator=g) * 0.02).to(bf16)
    b = (torch.randn(n, device=dev, generator=g) * 0.02).to(bf16) if with_bias else None
    positions = torch.randint(0, 4000, (m,), device=dev, generator=g)
    cos_sin = RotaryEmbedding(d, 4096, 1e6).cos_sin_cache.to(dev)
    num_blocks = (m + block_size) // block_size + 1
    slots = torch.randperm(num_blocks * block_size, device=dev, generator=g)[:m]
    slots[-(m // 4):] = -1  # a graph's padding rows
    caches = torch.zeros(2, num_blocks, block_size, kv_heads, d, device=dev, dtype=bf16)
    want = torch.nn.functional.linear(x, w, b)
    q, k, v = want.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    rotary_write_kv_triton(positions, q.view(m, heads, d), k.view(m, kv_heads, d),
                           v.view(m, kv_heads, d), cos_sin, caches[0], caches[1], slots)
    for cfg in ROPE_CONFIGS:
        got_caches = torch.zeros_like(caches)
        got = matmul_qkv_rope_triton(x, w, b, positions, cos_sin, got_caches[0],
                                     got_caches[1], slots, heads, kv_heads, cfg)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got_caches.float(), caches.float(), rtol=2e-2, atol=2e-2)
        assert torch.count_nonzero(got_caches.view(2, -1, kv_heads * d).abs().sum(-1)) == \
            2 * (m - m // 4)  # exactly the real rows' slots written


@pytest.mark.parametrize("forced", [CONFIGS[0], SPLIT_CONFIGS[0]], ids=["whole_k", "split_k"])
def test_engine_tokens_with_and_without_the_tiled_matmul(monkeypatch, forced):
    """fp16 tiny model (the path serves 16-bit weights; fp16 keeps near-ties of the argmax
    rarer than bf16), CUDA graphs: greedy tokens of 8 and 16 requests with every 8-128-row
    matmul forced through the Triton kernel (one config per op) equal those with cuBLAS."""
    loaded = build_tiny_llama(seed=0)
    loaded = loaded._replace(model=loaded.model.to("cuda", torch.float16))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 384, (4 + 3 * i,), generator=g).tolist() for i in range(16)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for tiled in (True, False):
        monkeypatch.setattr(matmul_triton, "_CHOICE", {})
        if tiled:
            monkeypatch.setattr(matmul_triton, "fastest_config",
                                lambda baseline, candidate, configs, rep, record=None:
                                forced if forced in configs else configs[0])
        else:
            monkeypatch.setattr(matmul_triton, "ENABLED", False)
        llm = LLM(loaded, num_kv_blocks=128, block_size=16)
        outs[tiled] = [[o.outputs[0].token_ids for o in llm.generate(prompts[:n], params,
                                                                      use_tqdm=False)]
                       for n in (8, 16)]
        if tiled:
            chosen = matmul_triton._CHOICE
            assert chosen and all(c == forced for k, c in chosen.items()
                                  if k[0] not in ("silu_mul", "qkv_rope"))
            assert any(k[0] == "silu_mul" for k in chosen)  # gate/up with its activation
            assert any(k[0] == "qkv_rope" for k in chosen)  # QKV with RoPE and the K/V write
    assert outs[True] == outs[False]
