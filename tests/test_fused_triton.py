"""Fused Triton elementwise ops against the torch modules of `pagedrt.models.layers`, on CPU
under TRITON_INTERPRET=1.

The torch modules are the oracle: the kernels mirror every rounding to the input dtype they
make, so fp32 agrees to float rounding and fp16/bf16 to about one ulp of the output.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.models import layers
from pagedrt.ops.attention_reference import write_kv_reference
from pagedrt.ops.fused_triton import (
    rms_norm_triton,
    rotary_triton,
    rotary_write_kv_triton,
    silu_and_mul_triton,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp32: relative 1e-5; half types: one or two ulp of values of order 1 (bf16's ulp at 1 is 2^-7).
# The interpreter (triton 3.9) casts fp32 -> bf16 by truncation, not round-to-nearest-even as
# the GPU does, so under it bf16 results can be an ulp off even where the GPU is exact.
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 2e-3, "atol": 1e-2},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 2e-2},
}


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, **TOL[expected.dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576, 896])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, hidden, with_residual):
    torch.manual_seed(hidden)
    num_tokens = 5
    norm = layers.RMSNorm(hidden, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden) * 0.5 + 1)
    # rows of a wider buffer: x is strided along tokens, as a slice of a larger activation
    x = (torch.randn(num_tokens, hidden + 8) * 3).to(dtype)[:, :hidden]
    residual = torch.randn(num_tokens, hidden).to(dtype) if with_residual else None
    x_before = x.clone()
    with torch.no_grad():
        expected = norm(x, residual)
        actual = rms_norm_triton(x, norm.weight, norm.eps, residual)
    assert torch.equal(x, x_before)  # inputs untouched
    if with_residual:
        # the add is one rounding of an fp32 sum, as in torch: bit-identical (bf16 aside, above)
        if dtype == torch.bfloat16:
            _close(actual[1], expected[1])
        else:
            assert torch.equal(actual[1], expected[1])
        _close(actual[0], expected[0])
    else:
        _close(actual, expected)


def test_rms_norm_output_dtype_follows_weight():
    x = torch.randn(3, 64, dtype=torch.float16)
    weight = torch.rand(64) + 0.5  # fp32 weight: torch promotes the product to fp32
    norm = layers.RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(weight)
        expected = norm(x)
    actual = rms_norm_triton(x, weight, 1e-5)
    assert actual.dtype == torch.float32
    _close(actual, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "head_dim, num_heads, num_kv_heads", [(16, 14, 2), (64, 14, 2), (16, 9, 3), (64, 9, 3)]
)
def test_rotary_on_qkv_views(dtype, head_dim, num_heads, num_kv_heads):
    torch.manual_seed(head_dim * num_heads)
    num_tokens, max_position = 6, 4096
    rope = layers.RotaryEmbedding(head_dim, max_position, base=10000.0)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size).to(dtype)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.view(num_tokens, num_heads, head_dim)  # non-contiguous: token stride is qkv's row
    k = k.view(num_tokens, num_kv_heads, head_dim)
    assert not q.is_contiguous() and not k.is_contiguous()
    positions = torch.randint(0, max_position, (num_tokens,), dtype=torch.int64)
    v_before = v.clone()

    expected_q, expected_k = rope(positions, q, k)  # torch path: new tensors
    actual_q, actual_k = rotary_triton(positions, q, k, rope.cos_sin_cache)
    assert actual_q.data_ptr() == q.data_ptr() and actual_k.data_ptr() == k.data_ptr()
    _close(actual_q, expected_q)
    _close(actual_k, expected_k)
    assert torch.equal(v, v_before)  # in place on q and k only: v's columns are untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "head_dim, num_heads, num_kv_heads", [(16, 4, 4), (64, 14, 2), (16, 9, 3), (32, 8, 1)]
)
def test_rotary_write_kv_matches_rotary_then_write(dtype, head_dim, num_heads, num_kv_heads):
    """The fused kernel = rotary_triton's rotation (torch RoPE as oracle) + write_kv_reference
    into the cache, padding slots (-1) skipped; the cache may be in another dtype."""
    torch.manual_seed(head_dim + num_heads)
    num_tokens, max_position, block_size, num_blocks = 7, 512, 4, 6
    rope = layers.RotaryEmbedding(head_dim, max_position, base=10000.0)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size).to(dtype)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.view(num_tokens, num_heads, head_dim)
    k = k.view(num_tokens, num_kv_heads, head_dim)
    v = v.view(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(0, max_position, (num_tokens,), dtype=torch.int64)
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[2] = -1  # padding: nothing written
    cache_dtype = torch.float32 if dtype != torch.float32 else torch.float16
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    k_ref_before = k_cache.clone()

    expected_q, expected_k = rope(positions, q, k)
    write_kv_reference(expected_k, v, k_ref, v_ref, slots)
    actual_q, actual_k = rotary_write_kv_triton(positions, q, k, v, rope.cos_sin_cache,
                                                k_cache, v_cache, slots)
    assert actual_q.data_ptr() == q.data_ptr() and actual_k.data_ptr() == k.data_ptr()
    _close(actual_q, expected_q)
    _close(actual_k, expected_k)
    tol = TOL[dtype] if dtype != torch.float32 else TOL[torch.float16]
    torch.testing.assert_close(k_cache, k_ref, **tol)
    torch.testing.assert_close(v_cache, v_ref, **tol)
    # exactly the six real tokens' slots changed (the reference wrote the same ones)
    assert int((k_cache != k_ref_before).any(-1).any(-1).sum()) == num_tokens - 1


def test_rotary_write_kv_contract_errors():
    q, k = torch.randn(2, 4, 16), torch.randn(2, 2, 16)
    cache, cos_sin = torch.randn(3, 4, 2, 16), torch.randn(8, 16)
    pos, slots = torch.zeros(2, dtype=torch.int64), torch.tensor([0, 5])
    with pytest.raises(ValueError, match="value"):
        rotary_write_kv_triton(pos, q, k, torch.randn(2, 2, 16).half(), cos_sin, cache,
                               cache.clone(), slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        rotary_write_kv_triton(pos, q, k, k.clone(), cos_sin, cache, cache.clone(),
                               slots[:1])
    one_head = torch.randn(3, 4, 1, 16)  # the cache has 1 KV head, key 2
    with pytest.raises(ValueError, match="key shape"):
        rotary_write_kv_triton(pos, q, k, k.clone(), cos_sin, one_head, one_head.clone(),
                               slots)


def test_attention_layer_fused_rope_and_kv_write(monkeypatch):
    """LlamaAttention with the fused kernels forced on (Triton attention, interpreter) gives
    the output and the cache of the torch path, on a prefill step with a padding token."""
    from tiny_model import TINY_CONFIG

    from pagedrt.models.llama import LlamaAttention
    from pagedrt.ops.attention import AttentionMetadata

    torch.manual_seed(5)
    attn = LlamaAttention(TINY_CONFIG)
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(torch.randn(param.shape) * 0.2)
    kvh, hd, bs = TINY_CONFIG.num_key_value_heads, TINY_CONFIG.head_dim, 4
    shape = (8, bs, kvh, hd)
    caches = [torch.zeros(shape), torch.zeros(shape)]
    ref_caches = [c.clone() for c in caches]
    x = torch.randn(6, TINY_CONFIG.hidden_size)
    positions = torch.tensor([0, 1, 2, 0, 1, 0])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([8, 9, 10, 20, 21, -1]),
        block_tables=torch.tensor([[2, 0], [5, 0]], dtype=torch.int32),
        seq_lens=torch.tensor([3, 2], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32),
        max_query_len=3, max_seq_len=3, backend="torch")
    with torch.no_grad():
        expected = attn(positions, x, tuple(ref_caches), meta)
        calls = []
        monkeypatch.setattr(layers, "_use_fused", lambda t: True)
        fused_kernel = layers._fused().rotary_write_kv_triton
        monkeypatch.setattr(layers._fused(), "rotary_write_kv_triton",
                            lambda *a, **kw: calls.append(1) or fused_kernel(*a, **kw))
        meta.backend = "triton"
        actual = attn(positions, x, tuple(caches), meta)
    assert calls == [1], "the fused RoPE + K/V write kernel did not run once"
    torch.testing.assert_close(actual[:5], expected[:5], rtol=1e-4, atol=1e-5)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
        assert c.abs().sum() > 0


def test_rotary_int32_positions_and_long_context():
    torch.manual_seed(0)
    rope = layers.RotaryEmbedding(64, 131072, base=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192})
    q = torch.randn(4, 4, 64)
    k = torch.randn(4, 2, 64)
    positions = torch.tensor([0, 1, 70000, 131071])
    expected_q, expected_k = rope(positions, q, k)
    actual_q, actual_k = rotary_triton(positions.int(), q.clone(), k.clone(), rope.cos_sin_cache)
    _close(actual_q, expected_q)
    _close(actual_k, expected_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [128, 4864])
def test_silu_and_mul(dtype, d):
    torch.manual_seed(d)
    x = (torch.randn(4, 2 * d) * 4).to(dtype)  # wide range: silu's tails matter
    expected = layers.SiluAndMul()(x)
    _close(silu_and_mul_triton(x), expected)


def test_layers_dispatch_to_the_kernels(monkeypatch):
    """With the dispatch forced on, the modules' results come from the kernels (on CPU here
    through the interpreter) and still match the torch path."""
    torch.manual_seed(1)
    norm = layers.RMSNorm(96)
    rope = layers.RotaryEmbedding(16, 64, base=10000.0)
    act = layers.SiluAndMul()
    x, residual = torch.randn(3, 96), torch.randn(3, 96)
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    positions = torch.tensor([5, 0, 63])
    gate_up = torch.randn(3, 64)
    with torch.no_grad():
        expected = (norm(x, residual), rope(positions, q, k), act(gate_up))
        calls = []
        monkeypatch.setattr(layers, "_use_fused", lambda t: calls.append(t) or True)
        actual = (norm(x, residual), rope(positions, q.clone(), k.clone()), act(gate_up))
    assert len(calls) == 3
    for a, e in zip([*actual[0], *actual[1], actual[2]], [*expected[0], *expected[1], expected[2]]):
        _close(a, e)


def test_fused_ops_switch(monkeypatch):
    monkeypatch.setattr(layers, "FUSED_OPS", False)
    assert not layers._use_fused(torch.empty(1))
    monkeypatch.setattr(layers, "FUSED_OPS", True)
    assert not layers._use_fused(torch.empty(1))  # CPU tensors always take the torch path


def test_contract_errors():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="weight has"):
        rms_norm_triton(x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_triton(x, torch.ones(64), 1e-6, torch.randn(4, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="stride"):
        rms_norm_triton(x.t(), torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="dtype"):
        rms_norm_triton(x.double(), torch.ones(64), 1e-6)
    cache = torch.randn(16, 16)
    q, k = torch.randn(2, 4, 16), torch.randn(2, 2, 16)
    with pytest.raises(ValueError, match="tokens"):
        rotary_triton(torch.zeros(3, dtype=torch.int64), q, k, cache)
    with pytest.raises(ValueError, match="positions.dtype"):
        rotary_triton(torch.zeros(2), q, k, cache)
    with pytest.raises(ValueError, match="head_dim"):
        rotary_triton(torch.zeros(2, dtype=torch.int64), q, torch.randn(2, 2, 8), cache)
    with pytest.raises(ValueError, match="key.dtype"):
        rotary_triton(torch.zeros(2, dtype=torch.int64), q, k.half(), cache)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_triton(torch.randn(2, 7))


def test_empty_batch():
    x = torch.randn(0, 64)
    out, res = rms_norm_triton(x, torch.ones(64), 1e-6, x.clone())
    assert out.shape == res.shape == (0, 64)
    assert silu_and_mul_triton(torch.randn(0, 32)).shape == (0, 16)
    q, k = torch.randn(0, 2, 16), torch.randn(0, 1, 16)
    rotary_triton(torch.zeros(0, dtype=torch.int64), q, k, torch.randn(8, 16))
