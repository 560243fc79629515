"""The warp-tile decode kernel (`pagedrt.ops.attention_decode_warp_triton`: each warp owns a
16-token slice of every tile and keeps its own softmax state, merged after the loop) against
the torch reference, on CPU under TRITON_INTERPRET=1: fp32/fp16 caches and FP8 caches (both V
layouts), GQA groups 1 to 8, block sizes 8 to 32, lengths at and around block and tile
boundaries (a sub-tile past the end of the last tile has seen no key: its weight must be 0),
split-K partitions including empty ones, NaN in unused slots and shuffled block tables.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri
from pagedrt.ops.attention_decode_warp_triton import warp_tile_shape
from tests.test_attention_triton import assert_close, edge_lens, make_paged_kv
from tests.test_fp8_kv_kernels import assert_close as assert_close_fp8
from tests.test_fp8_kv_kernels import fp8_paged_kv


def warp_config(block_n: int) -> dict:
    return {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 2, "warp_tiles": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group, block_size", [(1, 8), (2, 16), (4, 32), (7, 16), (8, 8)])
def test_warp_tiles_match_reference(dtype, group, block_size):
    num_kv_heads, head_dim = 2, 32
    lens = edge_lens(block_size) + [64, 127, 128, 129]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, num_kv_heads, head_dim, block_size,
                                                   dtype)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim).to(dtype)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_decode_reference(query.float(), k_cache.float(),
                                                    v_cache.float(), bt, seq_lens, scale)
    # 1: no split; 2: 65 -> 64 + a one-token partition; 8: empty partitions
    for block_n, num_splits in ((32, 1), (64, 2), (64, 8), (128, 1)):
        out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, scale,
                                                num_splits=num_splits,
                                                config=warp_config(block_n))
        assert_close(out, expected, dtype)


@pytest.mark.parametrize("v_dim_major", [True, False])
@pytest.mark.parametrize("group, block_size", [(1, 8), (3, 32), (4, 16), (8, 16)])
def test_warp_tiles_fp8_match_reference(v_dim_major, group, block_size):
    num_kv_heads, head_dim = 2, 32
    lens = edge_lens(block_size) + [128, 129]
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(
        lens, num_kv_heads, head_dim, block_size, seed=group * 10 + block_size,
        v_dim_major=v_dim_major)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens,
                                                    scale, k_scales=k_scales, v_scales=v_scales)
    for block_n, num_splits in ((32, 1), (64, 2), (128, 8)):
        out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, scale,
                                                num_splits=num_splits,
                                                config=warp_config(block_n),
                                                k_scales=k_scales, v_scales=v_scales)
        assert_close_fp8(out, expected)


def test_warp_tiles_equal_the_plain_kernel_on_bf16_queries_over_fp8():
    """A bf16 query over an FP8 cache (the engine's case: products in fp16, F16_MMA): the warp
    tiles give the plain kernel's attention within fp16 rounding."""
    lens = [1, 16, 17, 64, 65, 200]
    k, v, ks, vs, bt, seq_lens = fp8_paged_kv(lens, 2, 64, 16, seed=3, spread=False)
    query = torch.randn(len(lens), 8, 64).to(torch.bfloat16)
    plain = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.125, num_splits=2,
                                              config={"BLOCK_N": 64, "num_warps": 4,
                                                      "num_stages": 2},
                                              k_scales=ks, v_scales=vs)
    warp = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.125, num_splits=2,
                                             config=warp_config(64), k_scales=ks, v_scales=vs)
    assert torch.isfinite(warp).all()
    torch.testing.assert_close(warp.float(), plain.float(), rtol=0, atol=2e-2)


def test_warp_tiles_ignored_under_a_sliding_window():
    """Only `_decode_kernel` has the window: a config asking for warp tiles with a window runs
    it (same result as without warp_tiles), never the warp kernel unwindowed."""
    lens = [5, 40, 70]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, 2, 16, 16, torch.float32)
    query = torch.randn(len(lens), 4, 16)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.25,
                                                    sliding_window=20)
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.25,
                                            config=warp_config(32), sliding_window=20)
    assert_close(out, expected, torch.float32)


def test_warp_tiles_config_takes_0_or_1():
    """A launch config's warp_tiles is 1 (the warp-tile kernel) or 0 (`_decode_kernel`); any
    other value (several KV heads per program were removed, measured slower) is a ValueError
    naming it."""
    lens = [1, 17, 40]
    k32, v32, bt, seq_lens = make_paged_kv(lens, 2, 32, 16, torch.float32)
    query = torch.randn(len(lens), 4, 32)
    expected = ref.paged_attention_decode_reference(query, k32, v32, bt, seq_lens, 0.2)
    for good in (0, 1):
        out = tri.paged_attention_decode_triton(query, k32, v32, bt, seq_lens, 0.2, num_splits=2,
                                                config={**warp_config(32), "warp_tiles": good})
        assert_close(out, expected, torch.float32)
    for bad in (2, -1, 0.5, True):
        with pytest.raises(ValueError, match=f"warp_tiles={bad!r}; give 1 .* or 0"):
            tri.paged_attention_decode_triton(query, k32, v32, bt, seq_lens, 0.2,
                                              config={**warp_config(32), "warp_tiles": bad})


class _Recorder:
    """Stands in for a Triton kernel: records each `kernel[grid](...)` launch's constexpr
    SUB, then launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs["SUB"])
            return self.kernel[grid](*args, **kwargs)
        return launch


def test_fp8_default_launch_runs_warp_tiles_and_a_window_runs_the_plain_kernel(monkeypatch):
    """An FP8 cache's default decode (no config) is the warp-tile kernel at
    `_decode_launch_config`'s BLOCK_N 32 (SUB 2), split or not; with a sliding window it is
    `_decode_kernel` (which alone has one); an fp32 cache's default never runs warp tiles (16-bit ones do at head_dim 64:
    test_16_bit_default_launch_runs_warp_tiles). Each matches the reference."""
    recorder = _Recorder(tri._decode_warp_kernel)
    monkeypatch.setattr(tri, "_decode_warp_kernel", recorder)
    lens = [1, 31, 32, 33, 100]
    k, v, ks, vs, bt, seq_lens = fp8_paged_kv(lens, 2, 64, 16, seed=11)  # head_dim 64: the
    query = torch.randn(len(lens), 6, 64)  # default's warp tiles are for 64 and 128 only
    for window, num_splits in ((None, None), (None, 3), (40, None)):
        recorder.launches = []
        expected = ref.paged_attention_decode_reference(query, k, v, bt, seq_lens, 0.2,
                                                        k_scales=ks, v_scales=vs,
                                                        sliding_window=window)
        out = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.2, num_splits,
                                                sliding_window=window, k_scales=ks,
                                                v_scales=vs)
        assert_close_fp8(out, expected)
        warp = window is None
        assert recorder.launches == ([2] if warp else []), (window, num_splits)
    k32, v32, bt, seq_lens = make_paged_kv(lens, 2, 64, 16, torch.float32)
    recorder.launches = []
    out = tri.paged_attention_decode_triton(query, k32, v32, bt, seq_lens, 0.2)
    assert_close(out, ref.paged_attention_decode_reference(query, k32, v32, bt, seq_lens, 0.2),
                 torch.float32)
    assert recorder.launches == []


def test_16_bit_default_launch_runs_warp_tiles(monkeypatch):
    """A 16-bit cache's default decode at head_dim 64 is the warp-tile kernel (BLOCK_N 32,
    SUB 2), split or not, and `_decode_kernel` at head_dim 128 (`_decode_launch_config`);
    each matches the reference, over block-boundary lengths and NaN in unused slots."""
    recorder = _Recorder(tri._decode_warp_kernel)
    monkeypatch.setattr(tri, "_decode_warp_kernel", recorder)
    lens = [1, 31, 32, 33, 100]
    for head_dim, launches in ((64, [2]), (128, [])):
        k, v, bt, seq_lens = make_paged_kv(lens, 2, head_dim, 16, torch.float16)
        query = torch.randn(len(lens), 6, head_dim).half()
        expected = ref.paged_attention_decode_reference(query.float(), k.float(), v.float(),
                                                        bt, seq_lens, 0.2)
        for num_splits in (None, 3):
            recorder.launches = []
            out = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.2, num_splits)
            assert_close(out, expected, torch.float16)
            assert recorder.launches == launches, (head_dim, num_splits)


def test_warp_tile_shape():
    assert warp_tile_shape(64) == (4, 16)
    assert warp_tile_shape(128) == (8, 16)
    for bad in (16, 48 + 8, 0, 48, 96):  # SUB must be a power of two
        with pytest.raises(ValueError, match="BLOCK_N"):
            warp_tile_shape(bad)
