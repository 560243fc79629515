"""The decode matmul's QKV projection with RoPE and the K/V write in its epilogue
(pagedrt/ops/matmul_rope_triton.py) under the Triton interpreter on CPU: against the plain
chain it replaces (the tiled matmul, then `rotary_write_kv_triton`), its contract errors, and
the decoder's 8-128-row path end to end on the tiny model."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

from pagedrt.models import llama
from pagedrt.ops import matmul_rope_triton, matmul_triton
from pagedrt.ops.fused_triton import rotary_write_kv_triton
from pagedrt.ops.matmul_rope_triton import matmul_qkv_rope_triton
from pagedrt.ops.matmul_triton import matmul_triton as mm
from tests.decode_path import (
    assert_same_tokens,
    fall_back,
    generate_8_and_16,
    mixed_sampling,
    prompts_and_params,
)
from tests.tiny_model import build_tiny_llama

# both orientations; 16 pairs at head_dim 16 span two heads, 32 four; a K tile that does not
# divide K
CONFIGS = [(16, 16, 32, 4, 2, False), (16, 32, 32, 4, 2, True), (32, 16, 64, 4, 2, True)]
IDS = ["m16p16k32", "swap_m16p32k32", "swap_m32p16k64"]


def _chain(x, w, b, positions, cos_sin, k_cache, v_cache, slots, num_heads, num_kv_heads):
    """The plain path: the tiled matmul, then RoPE and the K/V write in their own kernel."""
    d = cos_sin.shape[-1]
    qkv = mm(x, w, b, (16, 32, 32, 4, 2, False))
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    m = x.shape[0]
    rotary_write_kv_triton(positions, q.view(m, num_heads, d), k.view(m, num_kv_heads, d),
                           v.view(m, num_kv_heads, d), cos_sin, k_cache, v_cache, slots)
    return qkv


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("heads", [(6, 6), (6, 2), (8, 1)], ids=["mha", "gqa3", "gqa8"])
@pytest.mark.parametrize("m", [8, 19])
def test_matches_the_chain(m, heads, config):
    """qkv rows and both caches as the chain's: GQA ratios 1, 3 and 8, fp32 and fp16, with a
    bias and without, padding rows (slot -1), slots at a block's first and last token, a
    row count that leaves a partial row tile, K not a multiple of BLOCK_K."""
    num_heads, num_kv_heads = heads
    _compare_with_chain(m, num_heads, num_kv_heads, config, d=16, k=40,
                        cases=((torch.float32, True), (torch.float16, False)))


@pytest.mark.parametrize("config", matmul_rope_triton.CONFIGS, ids=str)
def test_every_candidate_the_timing_may_pick_matches_the_chain(config):
    """Each config of the module's own CONFIGS (the narrow tiles among them) at head_dim 64,
    GQA 2, fp16 with a bias: 8 and 19 rows, K = 320 (BLOCK_K 256 does not divide it)."""
    for m in (8, 19):
        _compare_with_chain(m, 4, 2, config, d=64, k=320, cases=((torch.float16, True),))


def _compare_with_chain(m, num_heads, num_kv_heads, config, d, k, cases):
    """`matmul_qkv_rope_triton` with `config` against `_chain` on fresh inputs, for each
    (dtype, with_bias) of `cases`: qkv rows and both caches (NaN where no slot was written)."""
    block_size = 8
    n = (num_heads + 2 * num_kv_heads) * d
    g = torch.Generator().manual_seed(m * 10 + num_kv_heads + config[1] + d)
    for dtype, with_bias in cases:
        x = torch.randn(m, k, generator=g).to(dtype)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
        b = torch.randn(n, generator=g).to(dtype) if with_bias else None
        positions = torch.randint(0, 60, (m,), generator=g)
        cos_sin = torch.randn(64, d, generator=g)
        # the last token of block 0, the first of block 1, then distinct slots in random order
        rest = [s for s in torch.randperm(4 * block_size, generator=g).tolist() if s not in (7, 8)]
        slots = torch.tensor([7, 8] + rest[:m - 2])
        slots[m // 2] = -1  # a CUDA graph's padding row
        caches = [torch.full((4, block_size, num_kv_heads, d), float("nan"), dtype=dtype)
                  for _ in range(4)]
        got = matmul_qkv_rope_triton(x, w, b, positions, cos_sin, caches[0], caches[1], slots,
                                     num_heads, num_kv_heads, config)
        want = _chain(x, w, b, positions, cos_sin, caches[2], caches[3], slots, num_heads,
                      num_kv_heads)
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        for c_got, c_want in ((caches[0], caches[2]), (caches[1], caches[3])):
            # slots never written stay NaN in both; the written ones agree
            torch.testing.assert_close(c_got, c_want, rtol=tol, atol=tol, equal_nan=True)
            assert (~torch.isnan(c_got)).sum() == (m - 1) * num_kv_heads * d


def test_rows_past_128_only_with_fused_max_rows(monkeypatch):
    """144 rows: a ValueError naming the 8-128 range by default; with
    PAGEDRT_MATMUL_FUSED_MAX_ROWS=256 (`FUSED_MAX_ROWS`) the chain's qkv and cache rows."""
    g = torch.Generator().manual_seed(144)
    m, heads, kv_heads, d, k = 144, 2, 1, 16, 32
    x, w = torch.randn(m, k, generator=g), torch.randn((heads + 2 * kv_heads) * d, k, generator=g)
    positions, cos_sin = torch.randint(0, 64, (m,), generator=g), torch.randn(64, d, generator=g)
    slots = torch.randperm(20 * 8, generator=g)[:m]
    caches = [[torch.zeros(20, 8, kv_heads, d) for _ in range(2)] for _ in range(2)]
    with pytest.raises(ValueError, match="expected 8-128 rows"):
        matmul_qkv_rope_triton(x, w, None, positions, cos_sin, *caches[0], slots, heads, kv_heads)
    monkeypatch.setattr(matmul_triton, "FUSED_MAX_ROWS", 256)
    got = matmul_qkv_rope_triton(x, w, None, positions, cos_sin, *caches[0], slots, heads,
                                 kv_heads, CONFIGS[0])
    want = _chain(x, w, None, positions, cos_sin, *caches[1], slots, heads, kv_heads)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for c_got, c_want in zip(caches[0], caches[1], strict=True):
        torch.testing.assert_close(c_got, c_want, rtol=1e-5, atol=1e-5)


def test_bad_inputs():
    x, w = torch.randn(8, 16), torch.randn(64, 16)  # 2 + 2 x 1 heads of 16
    cs, pos = torch.randn(8, 16), torch.zeros(8, dtype=torch.long)
    slots = torch.zeros(8, dtype=torch.long)
    cache = torch.zeros(2, 4, 1, 16)
    with pytest.raises(ValueError, match="expected 8-128 rows"):
        matmul_qkv_rope_triton(x[:4], w, None, pos[:4], cs, cache, cache, slots[:4], 2, 1)
    with pytest.raises(ValueError, match="heads of 16"):
        matmul_qkv_rope_triton(x, w, None, pos, cs, cache, cache, slots, 3, 1)
    with pytest.raises(ValueError, match="v_cache"):
        matmul_qkv_rope_triton(x, w, None, pos, cs, cache, cache.half(), slots, 2, 1)
    with pytest.raises(ValueError, match="slot_mapping"):
        matmul_qkv_rope_triton(x, w, None, pos, cs, cache, cache, slots[:3], 2, 1)
    with pytest.raises(ValueError, match="bias"):
        matmul_qkv_rope_triton(x, w, torch.randn(63), pos, cs, cache, cache, slots, 2, 1)
    with pytest.raises(ValueError, match="positions is torch.float32"):
        matmul_qkv_rope_triton(x, w, None, pos.float(), cs, cache, cache, slots, 2, 1)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        matmul_qkv_rope_triton(x, w, None, pos, cs.T.contiguous().T, cache, cache, slots, 2, 1)
    with pytest.raises(ValueError, match="bias is torch.float16"):
        matmul_qkv_rope_triton(x, w, torch.randn(64).half(), pos, cs, cache, cache, slots, 2, 1)
    with pytest.raises(ValueError, match="powers of two"):
        matmul_qkv_rope_triton(x, w, None, pos, cs, cache, cache, slots, 2, 1,
                               (16, 24, 32, 4, 2, False))


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_batches_of_8_to_16_give_the_plain_tokens(monkeypatch, sampling):
    """Decoding 8 and 16 requests with every QKV projection of 8-16 rows through the kernel
    (fp32 under the interpreter) gives the plain path's tokens and nearly its logprobs, greedy
    and in a mixed batch of seeded sampling (top-k, top-p, min-p, penalties); with every fused
    op falling back, the plain path's logprobs bit for bit."""

    calls = []

    def rope_only(key, baseline, candidate, configs=None):
        calls.append(key[0])
        return CONFIGS[len(calls) % len(CONFIGS)] if key[0] == "qkv_rope" else None

    model = build_tiny_llama(seed=0)
    prompts, greedy = prompts_and_params(torch.Generator().manual_seed(9))
    params = mixed_sampling(len(prompts)) if sampling == "mixed" else greedy
    patches = ((llama, "uses_triton", lambda backend, x: True),)

    def generate(tiled, choice):
        return generate_8_and_16(monkeypatch, model, prompts, params, tiled, choice, patches)

    plain = generate(False, rope_only)
    assert not calls
    if sampling == "mixed":  # the seeded draws leave the greedy path somewhere
        plain_greedy = generate_8_and_16(monkeypatch, model, prompts, greedy, False, rope_only,
                                         patches)
        assert any(p.token_ids != g.token_ids for p, g in zip(plain, plain_greedy, strict=True))
    assert_same_tokens(generate(True, rope_only), plain)
    assert "qkv_rope" in calls  # the layers took the path
    fallback = generate(True, fall_back)
    assert [o.logprobs for o in fallback] == [o.logprobs for o in plain]
