"""A split decode's shortest partition (PAGEDRT_DECODE_MIN_PART) compiled on a CUDA GPU: the
default launches over bf16 (warp tiles at head_dim 64, `_decode_kernel` at 128) and FP8 caches
against the reference at floors from one tile to more than the longest context, eager and from
a replayed CUDA graph whose lengths change between replays (the floor is read at capture).
In the eager tests fresh tensors are filled with NaN (`nan_empty`), so an empty partition's
output, which the kernels no longer store, would show if the reduce read it.
Run on the GPU: python3 -m pytest -m gpu tests/gpu/test_decode_min_partition_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from test_decode_gpu import paged_case
from test_fp8_kv_gpu import _paged_fp8

from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ENV = "PAGEDRT_DECODE_MIN_PART"
LENS = [1, 31, 32, 33, 200, 512, 513, 4096, 4097]


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty and torch.empty_like give floating-point tensors filled with NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: nan(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: nan(empty_like(*a, **k)))


@pytest.mark.parametrize("floor", ["0", "64", "128", "256", "5000"])
@pytest.mark.parametrize("head_dim, group", [(64, 7), (128, 4), (64, 1)])
def test_floor_matches_reference_bf16(monkeypatch, nan_empty, floor, head_dim, group):
    k, v, bt, seq_lens = paged_case(LENS, 2, head_dim, torch.bfloat16, seed=group)
    query = torch.randn(len(LENS), 2 * group, head_dim, device="cuda").bfloat16()
    expected = ref.paged_attention_decode_reference(query.float(), k.float(), v.float(), bt,
                                                    seq_lens, head_dim ** -0.5)
    monkeypatch.setenv(ENV, floor)
    for num_splits in (None, 8, 64):
        out = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, head_dim ** -0.5,
                                                num_splits)
        assert torch.isfinite(out).all(), (floor, num_splits)
        err = (out.float() - expected).abs().max().item()
        assert err < 2e-2, (floor, num_splits, err)


@pytest.mark.parametrize("floor", ["0", "128", "5000"])
def test_floor_matches_reference_fp8(monkeypatch, nan_empty, floor):
    torch.manual_seed(3)
    caches, tables, seq_lens = _paged_fp8(LENS, 2, 64, 16)
    query = torch.randn(len(LENS), 14, 64, device="cuda").bfloat16()
    expected = ref.paged_attention_decode_reference(query, caches[0], caches[1], tables,
                                                    seq_lens, 0.125, k_scales=caches[2],
                                                    v_scales=caches[3])
    monkeypatch.setenv(ENV, floor)
    for num_splits in (None, 16):
        out = tri.paged_attention_decode_triton(query, caches[0], caches[1], tables, seq_lens,
                                                0.125, num_splits, k_scales=caches[2],
                                                v_scales=caches[3])
        assert torch.isfinite(out).all(), (floor, num_splits)
        torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_floor_in_a_replayed_graph(monkeypatch):
    """Captured with a floor of 128 and 64 splits (the engine's batch-1 shape), replayed over
    lengths that change (partitions that held tokens in one replay are empty in the next):
    each replay matches the reference."""
    monkeypatch.setenv(ENV, "128")
    k, v, bt, _ = paged_case([4097] * 4, 2, 64, torch.bfloat16, seed=11)
    query = torch.randn(4, 14, 64, device="cuda").bfloat16()
    seq_lens = torch.full((4,), 4097, dtype=torch.int32, device="cuda")
    tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.125, 64)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.125, 64)
    for lens in ([1, 128, 129, 4097], [300, 2000, 17, 64], [4097, 4096, 1000, 1]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        expected = ref.paged_attention_decode_reference(query.float(), k.float(), v.float(),
                                                        bt, seq_lens, 0.125)
        assert torch.isfinite(out).all(), lens
        assert (out.float() - expected).abs().max().item() < 2e-2, lens
