"""Sliding-window attention: the torch reference against a dense oracle, and the Triton kernels
against the reference, on CPU under TRITON_INTERPRET=1.

Every position before a query's window holds NaN, and the block-table entries of blocks wholly
before the window point at a NaN block (as after the KV manager has handed those blocks to
another sequence): any of it read into the arithmetic shows up as NaN in the output. Windows
end mid-block, exactly on a block boundary, and reach past the start of the context.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.ops import attention
from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri

ATOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def make_windowed_kv(seq_lens, q_lens, window, num_kv_heads, head_dim, block_size, dtype):
    """Caches with each sequence's K/V in shuffled blocks, NaN past seq_len and before the
    window of the sequence's first query (position seq_len - q_len); table entries of blocks
    wholly before that window point at an all-NaN block. Returns k_cache, v_cache,
    block_tables [num_seqs, max_blocks] int32, seq_lens int32, and the clean K/V per sequence
    ([seq_len, num_kv_heads, head_dim] each, for the dense oracle)."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    perm = torch.randperm(num_blocks)
    nan_block = int(perm[-1])
    block_tables = torch.full((len(seq_lens), max(blocks_per_seq) + 1), nan_block,
                              dtype=torch.int32)
    clean, used = [], 0
    for i, (n, q, nb) in enumerate(zip(seq_lens, q_lens, blocks_per_seq)):
        ids = perm[used:used + nb]
        used += nb
        k = torch.randn(nb * block_size, num_kv_heads, head_dim).to(dtype)
        v = torch.randn(nb * block_size, num_kv_heads, head_dim).to(dtype)
        clean.append((k[:n].clone(), v[:n].clone()))
        first_seen = max(n - q - window + 1, 0)  # the first query's window starts here
        k[n:] = v[n:] = float("nan")
        k[:first_seen] = v[:first_seen] = float("nan")
        k_cache[ids] = k.view(nb, block_size, num_kv_heads, head_dim)
        v_cache[ids] = v.view(nb, block_size, num_kv_heads, head_dim)
        ids = ids.clone()
        ids[: first_seen // block_size] = nan_block  # released blocks: stale entries
        block_tables[i, :nb] = ids.int()
    return k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32), clean


def dense_oracle(query, clean, q_lens, window, scale):
    """Each query token against the keys of its window, in float64, one at a time."""
    out, row = torch.empty(query.shape, dtype=torch.float64), 0
    group = query.shape[1] // clean[0][0].shape[1]
    for (k, v), q_len in zip(clean, q_lens):
        n = k.shape[0]
        for pos in range(n - q_len, n):
            lo = max(pos - window + 1, 0)
            kk = k[lo:pos + 1].double().repeat_interleave(group, dim=1)  # [w, heads, d]
            vv = v[lo:pos + 1].double().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,whd->hw", query[row].double(), kk) * scale
            out[row] = torch.einsum("hw,whd->hd", scores.softmax(-1), vv)
            row += 1
    return out


def assert_close(out, expected, dtype):
    assert torch.isfinite(out).all(), "output has NaN/inf: a key outside the window was read"
    err = (out.double() - expected.double()).abs().max().item()
    assert err <= ATOL[dtype], f"max abs error {err} > {ATOL[dtype]}"


def windows(block_size):
    """One token; ending mid-block; exactly one and two blocks; longer than every context."""
    return [1, 5, block_size, 2 * block_size, block_size + 3, 1000]


@pytest.mark.parametrize("block_size, group", [(8, 4), (16, 1), (16, 7)])
def test_decode_window_matches_dense_oracle(block_size, group):
    torch.manual_seed(block_size + group)
    lens = [1, block_size - 1, block_size, 2 * block_size, 2 * block_size + 1, 70]
    num_kv_heads, head_dim, scale = 2, 16, 0.3
    for window in windows(block_size):
        k_cache, v_cache, bt, seq_lens, clean = make_windowed_kv(
            lens, [1] * len(lens), window, num_kv_heads, head_dim, block_size, torch.float32)
        query = torch.randn(len(lens), num_kv_heads * group, head_dim)
        expected = dense_oracle(query, clean, [1] * len(lens), window, scale)
        out = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, scale,
                                                   sliding_window=window)
        assert_close(out, expected, torch.float32)
        # 1: no split; 3: ragged partitions of the window, empty ones past a short window
        for num_splits in (1, 3):
            out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, scale,
                                                    num_splits=num_splits, sliding_window=window)
            assert_close(out, expected, torch.float32)


@pytest.mark.parametrize("block_size, group", [(8, 1), (16, 2), (8, 8)])
def test_extend_window_matches_dense_oracle(block_size, group):
    """Chunks after a cached prefix (chunked prefill, prefix hits) and whole prompts; with one
    query head per KV head a 16-row tile spans more tokens than the small windows."""
    torch.manual_seed(10 * block_size + group)
    num_kv_heads, head_dim, scale = 2, 16, 0.25
    pairs = [(0, 1), (0, 37), (block_size, block_size), (block_size + 3, 21), (29, 1), (40, 9)]
    lens = [p + q for p, q in pairs]
    q_lens = [q for _, q in pairs]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    for window in windows(block_size):
        k_cache, v_cache, bt, seq_lens, clean = make_windowed_kv(
            lens, q_lens, window, num_kv_heads, head_dim, block_size, torch.float32)
        query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim)
        expected = dense_oracle(query, clean, q_lens, window, scale)
        out = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu, seq_lens,
                                                   scale, sliding_window=window)
        assert_close(out, expected, torch.float32)
        out = tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu, seq_lens,
                                                scale, sliding_window=window)
        assert_close(out, expected, torch.float32)


def test_extend_window_fp16_larger_tiles():
    """A 32-row tile config (BLOCK_M 32, BLOCK_N 16) in fp16: the band arithmetic with more
    tokens per tile than keys per tile."""
    torch.manual_seed(3)
    pairs, window, block_size = [(5, 60), (33, 2), (0, 45)], 20, 16
    lens, q_lens = [p + q for p, q in pairs], [q for _, q in pairs]
    k_cache, v_cache, bt, seq_lens, clean = make_windowed_kv(
        lens, q_lens, window, 1, 32, block_size, torch.float16)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(sum(q_lens), 2, 32).half()
    expected = dense_oracle(query, clean, q_lens, window, 0.2)
    out = tri.paged_attention_extend_triton(
        query, k_cache, v_cache, bt, cu, seq_lens, 0.2, sliding_window=window,
        config={"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1})
    assert_close(out, expected, torch.float16)


def test_window_covering_the_context_equals_full_attention():
    torch.manual_seed(0)
    k_cache, v_cache, bt, seq_lens, _ = make_windowed_kv([33, 50], [1, 1], 50, 2, 16, 8,
                                                         torch.float32)
    query = torch.randn(2, 4, 16)
    full = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.3)
    windowed = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.3,
                                                 sliding_window=50)
    torch.testing.assert_close(windowed, full, rtol=0, atol=0)


@pytest.mark.parametrize("q_lens", [[1, 1], [6, 11]], ids=["decode", "extend"])
def test_dispatcher_passes_the_window(q_lens):
    """paged_attention() with a window: Triton and torch backends agree, and differ from
    full attention (the window really cuts)."""
    torch.manual_seed(sum(q_lens))
    lens, window, block_size = [40, 27], 9, 8
    k_cache, v_cache, bt, seq_lens, _ = make_windowed_kv(lens, [1, 1], 1000, 2, 16, block_size,
                                                         torch.float32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    slots = torch.tensor([bt[i, p // block_size].item() * block_size + p % block_size
                          for i, (n, q) in enumerate(zip(lens, q_lens)) for p in range(n - q, n)])
    meta = attention.AttentionMetadata(
        slot_mapping=slots, block_tables=bt, seq_lens=seq_lens, cu_seqlens_q=cu,
        max_query_len=max(q_lens), max_seq_len=max(lens), backend="triton")
    n = sum(q_lens)
    query, key, value = torch.randn(n, 4, 16), torch.randn(n, 2, 16), torch.randn(n, 2, 16)
    out = attention.paged_attention(query, key, value, k_cache.clone(), v_cache.clone(), meta,
                                    0.25, sliding_window=window)
    meta.backend = "torch"
    expected = attention.paged_attention(query, key, value, k_cache.clone(), v_cache.clone(),
                                         meta, 0.25, sliding_window=window)
    full = attention.paged_attention(query, key, value, k_cache, v_cache, meta, 0.25)
    assert_close(out, expected, torch.float32)
    assert (expected - full).abs().max() > 1e-3


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_bad_window_is_refused(bad):
    k_cache, v_cache, bt, seq_lens, _ = make_windowed_kv([5], [1], 8, 1, 16, 8, torch.float32)
    query = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match="sliding_window"):
        tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 1.0,
                                          sliding_window=bad)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="sliding_window"):
        tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu, seq_lens, 1.0,
                                          sliding_window=bad)
