"""The prologue-fused skinny matmuls on CUDA (pagedrt/ops/gemv_triton.py): RMSNorm with the
residual add folded into QKV and gate/up, SiLU-and-mul into the down projection. The kernels
against the unfused modules in bf16 on the Qwen2-0.5B and Llama-3-8B layer shapes, and the
engine's greedy tokens with the fusion on and off (CUDA graphs on, batches of 1 to 4)."""

import pytest
import torch
from tiny_model import build_tiny_llama, perturb_norms

from pagedrt import LLM, SamplingParams
from pagedrt.models import layers
from pagedrt.models.layers import RMSNorm, SiluAndMul
from pagedrt.ops.gemv_triton import (
    CONFIGS,
    gemv_rmsnorm_triton,
    gemv_silu_mul_triton,
    gemv_triton,
    linear,
    row_configs,
)

SHAPES = {"qwen2": (896, 1152, 9728, 4864), "llama3": (4096, 6144, 28672, 14336)}


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_fused_prologues_match_the_modules_in_bf16(model, m):
    hidden, qkv, gate_up, inter = SHAPES[model]
    g = torch.Generator(device="cuda").manual_seed(m)
    dev, bf16 = "cuda", torch.bfloat16
    norm = RMSNorm(hidden, 1e-6).to(dev, bf16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(hidden, device=dev, generator=g))
    x = torch.randn(m, hidden, device=dev, generator=g).to(bf16)
    residual = torch.randn(m, hidden, device=dev, generator=g).to(bf16)
    h, want_residual = norm(x, residual)
    for n in (qkv, gate_up):
        w = (torch.randn(n, hidden, device=dev, generator=g) * 0.02).to(bf16)
        want = h.float() @ w.float().T
        for cfg in CONFIGS:
            y, new_residual = gemv_rmsnorm_triton(x, residual, norm.weight, norm.eps, w, None,
                                                  cfg)
            assert torch.equal(new_residual, want_residual)  # the GPU rounds as torch does
            torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)
    gu = torch.randn(m, 2 * inter, device=dev, generator=g).to(bf16)
    w = (torch.randn(hidden, inter, device=dev, generator=g) * 0.02).to(bf16)
    want = SiluAndMul()(gu).float() @ w.float().T
    for cfg in CONFIGS:
        got = gemv_silu_mul_triton(gu, w, None, cfg).float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("model", SHAPES)
def test_one_row_kernel_matches_the_modules_in_bf16(model):
    """The one-row kernel (`row_configs`, launched with PDL at one row) at every config of each
    projection: plain (O), RMSNorm + residual (QKV, gate/up), SwiGLU (down), bf16."""
    hidden, qkv, gate_up, inter = SHAPES[model]
    g = torch.Generator(device="cuda").manual_seed(5)
    dev, bf16 = "cuda", torch.bfloat16
    norm = RMSNorm(hidden, 1e-6).to(dev, bf16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(hidden, device=dev, generator=g))
    x = torch.randn(1, hidden, device=dev, generator=g).to(bf16)
    residual = torch.randn(1, hidden, device=dev, generator=g).to(bf16)
    h, want_residual = norm(x, residual)
    assert row_configs(hidden, 1) and row_configs(inter, 1)
    for n in (qkv, gate_up, hidden):
        w = (torch.randn(n, hidden, device=dev, generator=g) * 0.02).to(bf16)
        for cfg in row_configs(hidden, 1):
            got = gemv_triton(x, w, None, cfg).float()
            torch.testing.assert_close(got, x.float() @ w.float().T, rtol=2e-2, atol=2e-2)
            y, new_residual = gemv_rmsnorm_triton(x, residual, norm.weight, norm.eps, w, None,
                                                  cfg)
            assert torch.equal(new_residual, want_residual)
            torch.testing.assert_close(y.float(), h.float() @ w.float().T, rtol=2e-2, atol=2e-2)
    gu = torch.randn(1, 2 * inter, device=dev, generator=g).to(bf16)
    w = (torch.randn(hidden, inter, device=dev, generator=g) * 0.02).to(bf16)
    want = SiluAndMul()(gu).float() @ w.float().T
    for cfg in row_configs(inter, 1):
        got = gemv_silu_mul_triton(gu, w, None, cfg).float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_lm_head_rows_through_the_timed_skinny_matmul():
    """`linear` at an LM head's shape (Qwen2-0.5B's 151,936 x 896) for 1 and 4 rows: what it
    chose (cuBLAS or a config) gives F.linear's logits."""
    g = torch.Generator(device="cuda").manual_seed(9)
    w = (torch.randn(151936, 896, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    for m in (1, 4):
        x = torch.randn(m, 896, device="cuda", generator=g).to(torch.bfloat16)
        got, want = linear(x, w).float(), torch.nn.functional.linear(x, w).float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_engine_tokens_with_and_without_the_fusion(monkeypatch):
    """fp32 tiny model with perturbed norms: the fused decode path (timed per shape, inside
    CUDA graphs) gives the unfused path's greedy tokens for 1 to 4 requests."""
    loaded = perturb_norms(build_tiny_llama(seed=0), torch.Generator().manual_seed(11))
    loaded = loaded._replace(model=loaded.model.to("cuda"))
    prompts = [[1, 5, 9, 20, 7], list(range(3, 40)), list(range(100, 164)), [7]]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for fusion in (True, False):
        monkeypatch.setattr(layers, "SMALL_BATCH_FUSION", fusion)
        llm = LLM(loaded, num_kv_blocks=64, block_size=16, max_num_seqs=4)
        outs[fusion] = [[o.outputs[0].token_ids for o in llm.generate(prompts[:n], params,
                                                                       use_tqdm=False)]
                        for n in (1, 4)]
    assert outs[True] == outs[False]


@pytest.mark.parametrize("heads", [(14, 2, 64), (32, 8, 128)], ids=["qwen2", "llama3"])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_qkv_rope_matches_the_chain_in_bf16(m, heads):
    """QKV with RoPE and the K/V write in its epilogue (pagedrt/ops/gemv_rope_triton.py,
    PAGEDRT_FUSED_ROPE) against the skinny matmul with the RMSNorm prologue, then
    `rotary_write_kv_triton`, at Qwen2-0.5B's and Llama-3-8B's heads, every config: the qkv
    rows and the caches within bf16 rounding (the two sum in different orders)."""
    from pagedrt.ops.fused_triton import rotary_write_kv_triton
    from pagedrt.ops.gemv_rope_triton import CONFIGS as ROPE_CONFIGS
    from pagedrt.ops.gemv_rope_triton import qkv_rope_triton

    num_heads, num_kv_heads, d = heads
    hidden = num_heads * d
    n = (num_heads + 2 * num_kv_heads) * d
    g = torch.Generator(device="cuda").manual_seed(m)
    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(m, hidden, device=dev, generator=g).to(bf16)
    residual = torch.randn(m, hidden, device=dev, generator=g).to(bf16)
    norm_w = (1 + 0.2 * torch.randn(hidden, device=dev, generator=g)).to(bf16)
    w = (torch.randn(n, hidden, device=dev, generator=g) * 0.02).to(bf16)
    b = (torch.randn(n, device=dev, generator=g) * 0.02).to(bf16)
    positions = torch.tensor([5, 4095, 77, 1000][:m], device=dev)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=dev).float() / d))
    freqs = torch.outer(torch.arange(4096, device=dev).float(), inv)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    slots = torch.tensor([15, 16, -1, 40][:m], device=dev)
    want, want_res = gemv_rmsnorm_triton(x, residual, norm_w, 1e-6, w, b, CONFIGS[1])
    q, k, v = want.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    want_k = torch.zeros(4, 16, num_kv_heads, d, device=dev, dtype=bf16)
    want_v = torch.zeros_like(want_k)
    rotary_write_kv_triton(positions, q.view(m, num_heads, d), k.view(m, num_kv_heads, d),
                           v.view(m, num_kv_heads, d), cos_sin, want_k, want_v, slots)
    for cfg in ROPE_CONFIGS:
        k_cache, v_cache = torch.zeros_like(want_k), torch.zeros_like(want_v)
        got, got_res = qkv_rope_triton(x, w, b, positions, cos_sin, k_cache, v_cache, slots,
                                       num_heads, num_kv_heads, (residual, norm_w, 1e-6), cfg)
        assert torch.equal(got_res, want_res)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(k_cache.float(), want_k.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(v_cache.float(), want_v.float(), rtol=2e-2, atol=2e-2)


def test_engine_tokens_with_rope_in_the_qkv_kernel(monkeypatch):
    """PAGEDRT_FUSED_ROPE=1 (every 1-4-row QKV forced through the kernel), CUDA graphs: greedy
    tokens of 1 and 4 requests equal those of the unfused chain."""
    from pagedrt.ops import gemv_rope_triton, gemv_triton

    loaded = build_tiny_llama(seed=0)
    loaded = loaded._replace(model=loaded.model.to("cuda"))
    prompts = [[1, 5, 9, 20, 7], list(range(3, 40)), list(range(100, 164)), [7]]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    original = gemv_triton.fused_or_unfused
    forced_keys = []

    def forced(key, unfused, fused, *args, **kwargs):  # the kernel for every rope key
        if key[0] == "qkv_rope":
            forced_keys.append(key)
            return fused(gemv_rope_triton.CONFIGS[1])
        return original(key, unfused, fused, *args, **kwargs)

    for rope in (True, False):
        forced_keys.clear()
        monkeypatch.setattr(gemv_rope_triton, "ENABLED", rope)
        monkeypatch.setattr(gemv_triton, "fused_or_unfused", forced)
        llm = LLM(loaded, num_kv_blocks=64, block_size=16, max_num_seqs=4)
        outs[rope] = [[o.outputs[0].token_ids for o in llm.generate(prompts[:n], params,
                                                                     use_tqdm=False)]
                      for n in (1, 4)]
        assert bool(forced_keys) == rope
    assert outs[True] == outs[False]


@pytest.mark.parametrize(("dtype", "buckets", "batches"), [
    (torch.float32, {1}, (1, 4)),  # the 1-4-row skinny matmul and its fused ops
    (torch.float16, {8, 16}, (8, 16)),  # the 8-128-row matmul (16-bit weights only)
], ids=["one_row", "eight_and_sixteen_rows"])
def test_engine_tokens_with_the_in_step_timing(monkeypatch, dtype, buckets, batches):
    """PAGEDRT_STEP_TIMING at these batch sizes, every timed config of their ops a candidate
    (MARGIN 10): the in-step timing times at least one op of each batch size, leaves each at a
    config it timed, and the engine's greedy tokens equal those of an engine with the choices
    made alone (tiny model with perturbed norms, CUDA graphs; fp16 where the 8-128-row matmul
    serves, which keeps near-ties of the argmax rarer than bf16)."""
    from pagedrt.engine import step_timing
    from pagedrt.ops import config_timing, gemv_triton, matmul_triton

    loaded = perturb_norms(build_tiny_llama(seed=0), torch.Generator().manual_seed(11))
    loaded = loaded._replace(model=loaded.model.to("cuda", dtype))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 384, (4 + 3 * i,), generator=g).tolist() for i in range(16)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    monkeypatch.setattr(step_timing, "MARGIN", 10.0)
    monkeypatch.setattr(step_timing, "_DONE", set())
    monkeypatch.setattr(step_timing, "REPORT", [])
    outs = {}
    for enabled in (False, True):
        # fresh tables: each engine times its own shapes (the tables are per process)
        for module, table in ((gemv_triton, "_CHOICE"), (gemv_triton, "_FUSED_CHOICE"),
                              (matmul_triton, "_CHOICE"), (config_timing, "TIMED")):
            monkeypatch.setattr(module, table, {})
        monkeypatch.setattr(step_timing, "BUCKETS", frozenset(buckets if enabled else ()))
        # max_num_seqs 16: graphs (and ops timed at start-up) for batches 1-16 only; at the
        # default 256 each engine timed every op at every bucket up to 256, and the test ran
        # past 300 s on an H100 (2026-12-05) with Triton's cache warm
        llm = LLM(loaded, num_kv_blocks=128, block_size=16, max_num_seqs=16)
        outs[enabled] = [[o.outputs[0].token_ids for o in llm.generate(prompts[:n], params,
                                                                        use_tqdm=False)]
                         for n in batches]
        if enabled:
            timed_rows = {rows for _, rows, _ in config_timing.TIMED.values()}
            assert buckets <= timed_rows, timed_rows
            assert step_timing.REPORT, "no op was timed in a step"
            for choice in step_timing.REPORT:
                assert choice.chosen in choice.step_ms
                assert choice.chosen_alone in choice.step_ms
                assert all(ms > 0 for ms in choice.step_ms.values())
                table = next(t for (_, k), (t, _, _) in config_timing.TIMED.items()
                             if k == choice.key)
                assert table[choice.key] == choice.chosen
        else:
            assert not step_timing.REPORT
    assert outs[True] == outs[False]
