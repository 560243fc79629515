"""The batch-1 decode tuning override PAGEDRT_DECODE_BATCH1_CONFIG (the warp-tile launch of
one-sequence decode calls): its parsing and errors, that it reaches the launch at one sequence
only (never with a window, an explicit config or split count), and, on CPU under
TRITON_INTERPRET=1, the overridden launch against the torch reference over 16-bit-style (fp32)
and FP8 caches at contexts on and around a 512-token tile, with NaN in the unused slots."""

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

VAR = "PAGEDRT_DECODE_BATCH1_CONFIG"


@pytest.mark.parametrize("value", ["512,16,1", "512,16,1,x", "512,0,1,1", "48,4,1,1",
                                   "16,4,1,1"])
def test_bad_values_name_the_variable(value, monkeypatch):
    monkeypatch.setenv(VAR, value)
    with pytest.raises(ValueError, match=f"{VAR}.*(BLOCK_N,num_warps,num_stages,num_splits|"
                                         "16 times a power of two)"):
        tri.batch1_decode_override()


def test_parses(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert tri.batch1_decode_override() is None
    monkeypatch.setenv(VAR, " 512,16,1,2 ")
    assert tri.batch1_decode_override() == {"BLOCK_N": 512, "num_warps": 16, "num_stages": 1,
                                            "num_splits": 2}


def _launched(monkeypatch):
    """The configs each decode launch tries first, recorded."""
    seen = []
    real = tri.launch_first_fitting

    def spy(key, configs, launch):
        seen.append(configs[0])
        return real(key, configs, launch)

    monkeypatch.setattr(tri, "launch_first_fitting", spy)
    return seen


@pytest.mark.parametrize("context", [500, 512, 513, 1])
@pytest.mark.parametrize("setting", ["512,16,1,1", "256,8,2,2"])
def test_batch1_launch_matches_the_reference(context, setting, monkeypatch):
    """One sequence of GQA 7 over 2 KV heads (Qwen2-0.5B's), head_dim 64: the override's
    launch (one 512-token tile per program, or two partitions of 256-token tiles and the
    reduce) against the reference; the launch took the override."""
    monkeypatch.setenv(VAR, setting)
    seen = _launched(monkeypatch)
    torch.manual_seed(context)
    k_cache, v_cache, bt, seq_lens = make_paged_kv([context], 2, 64, 16, torch.float32)
    query = torch.randn(1, 14, 64)
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.125)
    assert_close(out, ref.paged_attention_decode_reference(query, k_cache, v_cache, bt,
                                                           seq_lens, 0.125), torch.float32)
    block_n = int(setting.split(",")[0])
    assert seen[0]["BLOCK_N"] == block_n and seen[0]["warp_tiles"] == 1


def test_batch1_launch_over_an_fp8_cache(monkeypatch):
    monkeypatch.setenv(VAR, "512,16,1,1")
    seen = _launched(monkeypatch)
    for context in (511, 512, 513):
        k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv([context], 2, 64, 16,
                                                                          seed=context)
        query = torch.randn(1, 14, 64)
        out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.125,
                                                k_scales=k_scales, v_scales=v_scales)
        expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens,
                                                        0.125, k_scales=k_scales,
                                                        v_scales=v_scales)
        assert_close_fp8(out, expected)
    assert all(c["BLOCK_N"] == 512 for c in seen)


def test_not_taken_past_one_sequence_or_with_a_window_or_given_launch(monkeypatch):
    monkeypatch.setenv(VAR, "512,16,1,1")
    seen = _launched(monkeypatch)
    k_cache, v_cache, bt, seq_lens = make_paged_kv([40, 70], 2, 64, 16, torch.float32)
    query = torch.randn(2, 14, 64)
    tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.125)
    one = (query[:1], k_cache, v_cache, bt[:1], seq_lens[:1], 0.125)
    tri.paged_attention_decode_triton(*one, sliding_window=16)
    tri.paged_attention_decode_triton(*one, num_splits=2)
    tri.paged_attention_decode_triton(*one, config={"BLOCK_N": 32, "num_warps": 1,
                                                    "num_stages": 2, "warp_tiles": 1})
    assert len(seen) == 4 and all(c["BLOCK_N"] != 512 for c in seen)
