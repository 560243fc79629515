"""One-token chunks in the extend kernel (decode rows the scheduler batches with prompts) on
their narrow tile (NARROW_M, `pagedrt.ops.attention_extend_triton`), on CPU under
TRITON_INTERPRET=1: against the torch reference and against the wide BLOCK_M tile they took
before (PAGEDRT_EXTEND_NARROW_DECODE=0), over 16/32-bit caches and FP8 caches with the step's
own rows, GQA groups 1 to 8, contexts at and one past block boundaries."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from test_attention_triton import ATOL, make_paged_kv
from test_fp8_kv_kernels import _chunk_kv, fp8_paged_kv

from pagedrt.ops import attention_extend_triton as ext
from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri


def _mixed_batch(block_size):
    """(seq_lens, q_lens): decode rows at contexts 1, a block, one past, two blocks + 1 and
    65, between prompts and chunks over prefixes."""
    pairs = [(0, 1), (block_size - 1, 1), (0, 2 * block_size + 3), (block_size, 1),
             (17, 9), (2 * block_size, 1), (64, 1), (block_size + 1, block_size)]
    return [p + q for p, q in pairs], [q for _, q in pairs]


def _cu(q_lens):
    return torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)


def _both_tiles(monkeypatch, *args, **kwargs):
    """The extend kernel's output with the narrow decode-row tile and with the wide one."""
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PAGEDRT_EXTEND_NARROW_DECODE", flag)
        outs.append(tri.paged_attention_extend_triton(*args, **kwargs))
    return outs


@pytest.mark.parametrize("group", [1, 2, 4, 7, 8])
@pytest.mark.parametrize("block_size", [8, 16])
def test_decode_rows_match_reference_and_the_wide_tile(group, block_size, monkeypatch):
    seq_lens, q_lens = _mixed_batch(block_size)
    torch.manual_seed(group * 10 + block_size)
    k_cache, v_cache, bt, lens = make_paged_kv(seq_lens, 2, 32, block_size, torch.float32)
    query = torch.randn(sum(q_lens), 2 * group, 32)
    args = (query, k_cache, v_cache, bt, _cu(q_lens), lens, 0.2)
    expected = ref.paged_attention_extend_reference(*args)
    narrow, wide = _both_tiles(monkeypatch, *args)
    for out in (narrow, wide):  # (the interpreter sums both tiles' rows alike: no equality
        assert torch.isfinite(out).all()  # check tells the paths apart; mutations of the
        assert (out - expected).abs().max() <= ATOL[torch.float32]  # narrow one fail here)


@pytest.mark.parametrize("group, query_dtype", [(1, torch.float32), (4, torch.bfloat16),
                                                (7, torch.float32), (8, torch.bfloat16)])
def test_fp8_decode_rows_with_their_own_rows(group, query_dtype, monkeypatch):
    """Over an FP8 cache with the step's rows: a decode row's own key and value come from the
    rows (here unlike the cache's, so the wrong source shows), the rest from the cache."""
    block_size = 16
    seq_lens, q_lens = _mixed_batch(block_size)
    k_cache, v_cache, ks, vs, bt, lens = fp8_paged_kv(seq_lens, 2, 32, block_size, seed=group)
    gen = torch.Generator().manual_seed(group)
    query = torch.randn(sum(q_lens), 2 * group, 32, generator=gen).to(query_dtype)
    key, value = _chunk_kv(sum(q_lens), 2, 32, query_dtype, seed=group + 1)
    args = (query, k_cache, v_cache, bt, _cu(q_lens), lens, 0.2)
    kw = {"k_scales": ks, "v_scales": vs, "key": key, "value": value}
    expected = ref.paged_attention_extend_reference(*args, **kw).float()
    narrow, wide = (o.float() for o in _both_tiles(monkeypatch, *args, **kw))
    tol = 1e-5 if query_dtype == torch.float32 else 2e-2  # of the largest output
    for out in (narrow, wide):
        assert torch.isfinite(out).all()
        assert (out - expected).abs().max() / expected.abs().max() <= tol
    cache_only = ref.paged_attention_extend_reference(*args, k_scales=ks, v_scales=vs).float()
    # the first decode row has no prefix: its output is its own value row, not the cache's
    assert (expected[0] - cache_only[0]).abs().max() > 0.1


def test_narrow_tile_rows_and_switch():
    """NARROW_M is max(16, GROUP rounded up to a power of two) rows; the switch reads the
    environment at each call."""
    os.environ.pop("PAGEDRT_EXTEND_NARROW_DECODE", None)
    assert ext.narrow_decode_rows_requested()
    os.environ["PAGEDRT_EXTEND_NARROW_DECODE"] = "0"
    try:
        assert not ext.narrow_decode_rows_requested()
    finally:
        del os.environ["PAGEDRT_EXTEND_NARROW_DECODE"]
