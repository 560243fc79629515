"""Verification attention as decode rows: each query token of a short chunk attends as a decode
row of its own (its sequence's block-table row, seq_len = its position + 1), which the
verification CUDA graphs use (pagedrt/engine/cuda_graphs.py). Checked against the extend path
and the torch reference, under TRITON_INTERPRET=1 for the kernels."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from test_attention_triton import assert_close, make_paged_kv

from pagedrt.engine.cuda_graphs import CUDAGraphRunner
from pagedrt.kv.kv_cache import KVCache, KVCacheSpec
from pagedrt.ops import attention


def _chunk_meta(bt, seq_lens, q, block_size, backend):
    """Metadata of a step whose last q tokens of every sequence are new (the extend form) and
    the per-token decode rows of the same step; returns (meta, positions)."""
    positions = torch.cat([torch.arange(n - q, n) for n in seq_lens])
    rows = torch.arange(len(seq_lens)).repeat_interleave(q)
    slots = bt[rows, positions // block_size].long() * block_size + positions % block_size
    cu = torch.arange(len(seq_lens) + 1, dtype=torch.int32) * q
    meta = attention.AttentionMetadata(
        slot_mapping=slots, block_tables=bt, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        cu_seqlens_q=cu, max_query_len=q, max_seq_len=max(seq_lens), backend=backend)
    return meta, positions


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("window", [None, 11])
def test_chunk_as_decode_rows_matches_extend(group, window):
    """Chunks of q = 6 ending at edge lengths (the chunk alone, exactly 2 and 4 blocks, one
    past, mid-block), a window ending mid-block or none: the decode-row form (Triton) equals
    the extend kernel and the torch reference, and writes the same K/V."""
    torch.manual_seed(group * 100 + (window or 0))
    num_kv_heads, head_dim, block_size, q = 2, 16, 8, 6
    seq_lens = [q, 16, 17, 32, 33, 45]
    k_cache, v_cache, bt, _ = make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size,
                                            torch.float32)
    num_tokens = q * len(seq_lens)
    query = torch.randn(num_tokens, num_kv_heads * group, head_dim)
    key = torch.randn(num_tokens, num_kv_heads, head_dim)
    value = torch.randn(num_tokens, num_kv_heads, head_dim)
    outs, caches = {}, {}
    for form, backend in (("extend", "triton"), ("rows", "triton"), ("extend", "torch")):
        meta, positions = _chunk_meta(bt, seq_lens, q, block_size, backend)
        if form == "rows":
            meta.query_block_tables = bt.repeat_interleave(q, dim=0)
            meta.query_seq_lens = (positions + 1).to(torch.int32)
        kc, vc = k_cache.clone(), v_cache.clone()
        outs[form, backend] = attention.paged_attention(query, key, value, kc, vc, meta, 0.25,
                                                        sliding_window=window)
        caches[form, backend] = (kc, vc)
    expected = outs["extend", "torch"]
    assert_close(outs["rows", "triton"], expected, torch.float32)
    assert_close(outs["extend", "triton"], expected, torch.float32)
    for got in (caches["rows", "triton"], caches["extend", "triton"]):
        for a, b in zip(got, caches["extend", "torch"]):
            torch.testing.assert_close(a, b, equal_nan=True)  # NaN: unused slots


def test_decode_rows_with_the_torch_backend():
    """The torch backend honours the decode-row form too (the reference path stays the
    oracle): same output as its own extend."""
    torch.manual_seed(3)
    seq_lens, q, block_size = [7, 24, 25], 4, 8
    k_cache, v_cache, bt, _ = make_paged_kv(seq_lens, 1, 16, block_size, torch.float32)
    query = torch.randn(q * len(seq_lens), 3, 16)
    key, value = torch.randn(q * len(seq_lens), 1, 16), torch.randn(q * len(seq_lens), 1, 16)
    meta, positions = _chunk_meta(bt, seq_lens, q, block_size, "torch")
    expected = attention.paged_attention(query, key, value, k_cache.clone(), v_cache.clone(),
                                         meta, 0.25)
    meta.query_block_tables = bt.repeat_interleave(q, dim=0)
    meta.query_seq_lens = (positions + 1).to(torch.int32)
    out = attention.paged_attention(query, key, value, k_cache, v_cache, meta, 0.25)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_verification_graph_forward_matches_extend(tiny, monkeypatch, backend):
    """The graph runner's verification forward (run eagerly here: the same `_forward` a
    capture records) gives the same logits with decode-row attention as with the extend
    kernel (PAGEDRT_VERIFY_ATTENTION=extend), for 3 sequences of q = 4 tokens in a bucket of 4
    (the fourth row padded as `run` pads it)."""
    model, mc = tiny.model, tiny.model_config
    block_size, q, width = 8, 4, 6
    cache = KVCache(KVCacheSpec.for_model(mc, block_size, torch.float32), 20, 0,
                    torch.device("cpu"), backend)
    torch.manual_seed(0)
    contexts = [3, 16, 29]  # tokens before the chunk: mid-block, exactly 2 blocks, mid-block
    tables = torch.randperm(20)[:18].view(3, 6).to(torch.int32)
    for layer in cache.layers:  # a random history in every sequence's blocks
        layer.k_cache.normal_()
        layer.v_cache.normal_()
    logits = {}
    for form in ("decode", "extend"):
        monkeypatch.setenv("PAGEDRT_VERIFY_ATTENTION", form)
        runner = CUDAGraphRunner(model, [tuple(t.clone() for t in layer[:2])
                                         for layer in cache.layers],
                                 max_num_seqs=4, max_blocks_per_seq=width,
                                 device=torch.device("cpu"), backend=backend,
                                 verify_query_len=q, verify_max_num_seqs=4)
        assert runner.verify_as_decode == (form == "decode")
        positions = torch.cat([torch.arange(c, c + q) for c in contexts])
        rows = torch.arange(3).repeat_interleave(q)
        slots = tables[rows, positions // block_size].long() * block_size + positions % block_size
        runner.input_ids[:3 * q] = torch.randint(0, mc.vocab_size, (3 * q,),
                                                 generator=torch.Generator().manual_seed(1))
        runner.positions[:3 * q] = positions
        runner.slot_mapping[:3 * q] = slots
        runner.seq_lens[:3] = torch.tensor(contexts, dtype=torch.int32) + q
        runner.block_tables[:3] = tables
        runner.slot_mapping[3 * q: 4 * q] = -1  # the padded row, as `run` leaves it
        runner.positions[3 * q: 4 * q] = 0
        runner.seq_lens[3] = q
        with torch.inference_mode():
            logits[form] = runner._forward(4, q)[: 3 * q]
    torch.testing.assert_close(logits["decode"], logits["extend"], rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("PAGEDRT_VERIFY_ATTENTION", "extent")  # a typo: refused by name
    with pytest.raises(ValueError, match="PAGEDRT_VERIFY_ATTENTION='extent'; set it to decode "
                                         "or extend"):
        CUDAGraphRunner(model, [layer[:2] for layer in cache.layers], max_num_seqs=4,
                        max_blocks_per_seq=width, device=torch.device("cpu"), backend=backend)


@pytest.mark.parametrize("v_dim_major", [False, True])
def test_decode_rows_over_an_fp8_cache(v_dim_major):
    """Over an FP8 cache (per-token scales, NaN in unused slots): the decode-row form writes
    the chunk's K/V and attends like the extend kernel, and like the torch reference."""
    from test_fp8_kv_kernels import fp8_paged_kv

    torch.manual_seed(7)
    q, block_size, num_kv_heads, head_dim = 5, 8, 2, 16
    seq_lens = [q, 16, 21]
    caches = fp8_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, seed=3,
                          v_dim_major=v_dim_major)
    bt = caches[4]
    num_tokens = q * len(seq_lens)
    query = torch.randn(num_tokens, 3 * num_kv_heads, head_dim)
    key = torch.randn(num_tokens, num_kv_heads, head_dim) * 2
    value = torch.randn(num_tokens, num_kv_heads, head_dim)
    outs = {}
    for form, backend in (("extend", "triton"), ("rows", "triton"), ("extend", "torch")):
        meta, positions = _chunk_meta(bt, seq_lens, q, block_size, backend)
        if form == "rows":
            meta.query_block_tables = bt.repeat_interleave(q, dim=0)
            meta.query_seq_lens = (positions + 1).to(torch.int32)
        k_cache, v_cache, k_scales, v_scales = (t.clone() for t in caches[:4])
        outs[form, backend] = attention.paged_attention(
            query, key, value, k_cache, v_cache, meta, 0.25, k_scales=k_scales,
            v_scales=v_scales)
    expected = outs["extend", "torch"]
    for got in (outs["rows", "triton"], outs["extend", "triton"]):
        assert torch.isfinite(got).all(), "an unused slot was read"
        err = ((got - expected).abs().max() / expected.abs().max()).item()
        assert err <= 1e-5, err
