"""A split decode's shortest partition (PAGEDRT_DECODE_MIN_PART, `decode_min_partition`) on CPU
under TRITON_INTERPRET=1: both decode kernels (`_decode_kernel`, with and without a sliding
window, and the warp tiles over 16-bit and FP8 caches, one and two KV heads per program) give
the reference's attention with every floor, from one tile to more than the longest context,
and a floor that is not a multiple of the tile; and the reduce never reads the output of an
empty partition, which the split kernels no longer store.

Fresh buffers hold NaN here (`nan_empty`, as tests/test_decode_fused_reduce.py): the partials
of empty partitions are then NaN, so a combine that read one would show it.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from test_attention_triton import assert_close, make_paged_kv
from test_fp8_kv_kernels import assert_close as assert_close_fp8
from test_fp8_kv_kernels import fp8_paged_kv

from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri

ENV = "PAGEDRT_DECODE_MIN_PART"
BLOCK_SIZE = 16
# one token, a tile and one past it, k * block_size and one past it, a long row
LENS = [1, 16, 17, 32, 33, 100, 257]
FLOORS = ["0", "16", "40", "64", "1000"]  # 40: not a multiple of any tile; 1000: one partition
PLAIN_TILES = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def warp_config(block_n: int, kv_heads: int = 1) -> dict:
    return {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 2, "warp_tiles": kv_heads}


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty and torch.empty_like give floating-point tensors filled with NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: nan(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: nan(empty_like(*a, **k)))


def test_the_floor_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert tri.decode_min_partition() == 0
    monkeypatch.setenv(ENV, "128")
    assert tri.decode_min_partition() == 128
    for bad in ("-1", "64.0", "tile"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"PAGEDRT_DECODE_MIN_PART='{bad}'.*int >= 0"):
            tri.decode_min_partition()


@pytest.mark.parametrize("floor", FLOORS)
@pytest.mark.parametrize("group", [1, 7])
def test_plain_kernel_with_a_floor(monkeypatch, nan_empty, floor, group):
    torch.manual_seed(group)
    k_cache, v_cache, bt, seq_lens = make_paged_kv(LENS, 2, 32, BLOCK_SIZE, torch.float32)
    query = torch.randn(len(LENS), 2 * group, 32)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2)
    monkeypatch.setenv(ENV, floor)
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                            num_splits=8, config=PLAIN_TILES)
    assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("floor", ["0", "40", "1000"])
def test_plain_kernel_with_a_floor_and_a_window(monkeypatch, nan_empty, floor):
    """A 40-token window: the floor splits [seq_len - 40, seq_len), not the whole row."""
    torch.manual_seed(2)
    k_cache, v_cache, bt, seq_lens = make_paged_kv(LENS, 2, 32, BLOCK_SIZE, torch.float32)
    query = torch.randn(len(LENS), 8, 32)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                                    sliding_window=40)
    monkeypatch.setenv(ENV, floor)
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                            num_splits=8, config=PLAIN_TILES,
                                            sliding_window=40)
    assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("floor", FLOORS)
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_warp_tiles_with_a_floor(monkeypatch, nan_empty, floor, kv_heads):
    """Qwen2-0.5B's 7 query heads per KV head at head_dim 64 in fp16, 32-token tiles."""
    torch.manual_seed(kv_heads)
    k_cache, v_cache, bt, seq_lens = make_paged_kv(LENS, 2, 64, BLOCK_SIZE, torch.float16)
    query = torch.randn(len(LENS), 14, 64).half()
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.125)
    monkeypatch.setenv(ENV, floor)
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.125,
                                            num_splits=8, config=warp_config(32, kv_heads))
    assert_close(out, expected, torch.float16)


@pytest.mark.parametrize("floor", ["0", "40", "1000"])
def test_warp_tiles_fp8_with_a_floor(monkeypatch, nan_empty, floor):
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(LENS, 2, 32, BLOCK_SIZE,
                                                                      seed=5)
    query = torch.randn(len(LENS), 8, 32)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                                    k_scales=k_scales, v_scales=v_scales)
    monkeypatch.setenv(ENV, floor)
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                            num_splits=8, config=warp_config(32),
                                            k_scales=k_scales, v_scales=v_scales)
    assert_close_fp8(out, expected)


def test_a_floor_changes_only_the_partitions(monkeypatch):
    """The same launch with floors 0 and 64 agrees to fp32 rounding (the sums' order moves)."""
    torch.manual_seed(9)
    k_cache, v_cache, bt, seq_lens = make_paged_kv(LENS, 2, 32, BLOCK_SIZE, torch.float32)
    query = torch.randn(len(LENS), 8, 32)
    outs = []
    for floor in ("0", "64"):
        monkeypatch.setenv(ENV, floor)
        outs.append(tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens,
                                                      0.2, num_splits=8, config=PLAIN_TILES))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_the_reduce_reads_no_output_of_an_empty_partition():
    """`_decode_reduce_kernel` over partials whose empty partitions (lse -inf) hold NaN
    outputs: the combined rows are those of the other partitions alone."""
    torch.manual_seed(4)
    num_seqs, num_heads, num_splits, head_dim = 2, 3, 8, 32
    part_out = torch.randn(num_seqs, num_heads, num_splits, head_dim)
    part_lse = torch.randn(num_seqs, num_heads, num_splits)
    empty = torch.zeros(num_splits, dtype=torch.bool)
    empty[[1, 4, 5, 7]] = True
    live_out, live_lse = part_out[:, :, ~empty].clone(), part_lse[:, :, ~empty].clone()
    part_out[:, :, empty] = float("nan")
    part_lse[:, :, empty] = float("-inf")
    out = torch.empty(num_seqs, num_heads, head_dim)
    tri._decode_reduce_kernel[(num_heads, num_seqs)](
        part_out, part_lse, out, out.stride(0), out.stride(1), num_heads, num_splits,
        HEAD_DIM=head_dim, SPLITS_PAD=num_splits, HEADS=1)
    weight = torch.softmax(live_lse * torch.log(torch.tensor(2.0)), dim=-1)  # log2 domain
    expected = (live_out * weight[..., None]).sum(2)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
