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
from pagedrt.ops.fused_triton import rms_norm_triton, rotary_triton, silu_and_mul_triton

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
