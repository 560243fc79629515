"""Triton attention kernels against the torch reference, on CPU under TRITON_INTERPRET=1.

Shapes are tiny (the interpreter runs each program in numpy). Every cache starts filled with
NaN, block tables are shuffled, and slots past each sequence's end are NaN too, so any read
of an unused slot or a foreign block shows up as NaN in the output.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.ops import attention
from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri

ATOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype, spare_blocks=3):
    """NaN-filled caches with each sequence's K/V in shuffled blocks; NaN past seq_len.

    Returns k_cache, v_cache, block_tables [num_seqs, max_blocks] int32, seq_lens int32.
    """
    blocks_per_seq = [max(1, -(-n // block_size)) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    perm = torch.randperm(num_blocks)
    # padding entries point at a NaN block that is not the sequence's
    block_tables = torch.full((len(seq_lens), max(blocks_per_seq) + 1), int(perm[-1]),
                              dtype=torch.int32)
    used = 0
    for i, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        ids = perm[used:used + nb]
        used += nb
        block_tables[i, :nb] = ids.int()
        k = torch.randn(nb * block_size, num_kv_heads, head_dim).to(dtype)
        v = torch.randn(nb * block_size, num_kv_heads, head_dim).to(dtype)
        k[n:] = float("nan")
        v[n:] = float("nan")
        k_cache[ids] = k.view(nb, block_size, num_kv_heads, head_dim)
        v_cache[ids] = v.view(nb, block_size, num_kv_heads, head_dim)
    return k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32)


def assert_close(out, expected, dtype):
    assert torch.isfinite(out).all(), "output has NaN/inf"
    err = (out.float() - expected.float()).abs().max().item()
    assert err <= ATOL[dtype], f"max abs error {err} > {ATOL[dtype]}"


def edge_lens(block_size):
    # one token, around 16, around k * block_size, and lengths giving a one-token last tile
    return [1, 15, 16, 17, 2 * block_size - 1, 2 * block_size, 2 * block_size + 1, 65, 100]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 4, 7, 8])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_decode_matches_reference(dtype, group, block_size):
    torch.manual_seed(group * 100 + block_size)
    num_kv_heads, head_dim = 2, 32
    lens = edge_lens(block_size)
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, num_kv_heads, head_dim, block_size,
                                                    dtype)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim).to(dtype)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, scale)
    # 1: no split; None: heuristic; 2: 65 -> 64 + one-token partition; 8: many empty partitions
    for num_splits in (1, None, 2, 8):
        out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, scale,
                                                num_splits=num_splits)
        assert_close(out, expected, dtype)


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_head_dims_and_bf16(head_dim, dtype):
    torch.manual_seed(head_dim)
    lens = [1, 33, 64, 97]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, 2, head_dim, 16, dtype)
    query = torch.randn(len(lens), 14, head_dim).to(dtype)  # Qwen2-0.5B's 14q / 2kv
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.3)
    for num_splits in (1, 3):
        out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.3,
                                                num_splits=num_splits)
        assert_close(out, expected, dtype)


@pytest.mark.parametrize("group", [1, 7])
def test_naive_decode_matches_reference(group):
    torch.manual_seed(group)
    lens = [1, 16, 17, 50]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, 2, 32, 16, torch.float16)
    query = torch.randn(len(lens), 2 * group, 32).to(torch.float16)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2)
    out = tri.paged_attention_decode_naive_triton(query, k_cache, v_cache, bt, seq_lens, 0.2)
    assert_close(out, expected, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 4, 7, 8])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_extend_matches_reference(dtype, group, block_size):
    torch.manual_seed(group * 7 + block_size)
    num_kv_heads, head_dim = 2, 32
    # (cached prefix, query length) pairs: prefixes 0, 16, 17 x lengths 1, 5, bs, bs + 1
    pairs = [(p, q) for p in (0, 16, 17) for q in (1, 5, block_size, block_size + 1)]
    pairs = pairs[(group + block_size) % 2::2]  # half of them per case keeps CI fast
    seq_lens_list = [p + q for p, q in pairs]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(seq_lens_list, num_kv_heads, head_dim,
                                                    block_size, dtype)
    q_lens = torch.tensor([q for _, q in pairs])
    cu_seqlens_q = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32)
    query = torch.randn(int(q_lens.sum()), num_kv_heads * group, head_dim).to(dtype)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu_seqlens_q,
                                                    seq_lens, scale)
    out = tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu_seqlens_q, seq_lens,
                                            scale)
    assert_close(out, expected, dtype)


def test_extend_bf16_long_prompt():
    torch.manual_seed(1)
    k_cache, v_cache, bt, seq_lens = make_paged_kv([70, 3], 2, 64, 16, torch.bfloat16)
    cu_seqlens_q = torch.tensor([0, 53, 54], dtype=torch.int32)  # 17 cached + 53 new; decode
    query = torch.randn(54, 14, 64).to(torch.bfloat16)
    expected = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu_seqlens_q,
                                                    seq_lens, 0.125)
    out = tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu_seqlens_q, seq_lens,
                                            0.125)
    assert_close(out, expected, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [8, 32])
def test_write_kv_skips_padding(dtype, block_size):
    torch.manual_seed(block_size)
    num_blocks, num_kv_heads, head_dim = 6, 3, 16
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    v_cache = torch.randn_like(k_cache)
    slots = torch.randperm(num_blocks * block_size)[:9].long()
    slots[[2, 5]] = -1  # padding tokens
    key = torch.randn(9, num_kv_heads, head_dim).to(dtype)
    value = torch.randn(9, num_kv_heads, head_dim).to(dtype)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    ref.write_kv_reference(key, value, k_expected, v_expected, slots)
    tri.write_kv_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


def test_copy_blocks():
    torch.manual_seed(0)
    caches = [torch.randn(7, 8, 2, 16).half() for _ in range(4)]
    k_caches, v_caches = caches[:2], caches[2:]
    k_expected = [c.clone() for c in k_caches]
    v_expected = [c.clone() for c in v_caches]
    mapping = torch.tensor([[0, 3], [5, 1], [0, 6]], dtype=torch.int64)
    ref.copy_blocks_reference(k_expected, v_expected, mapping)
    tri.copy_blocks_triton(k_caches, v_caches, mapping)
    for got, want in zip(k_caches + v_caches, k_expected + v_expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize("seq_lens, q_lens", [([9, 20], [1, 1]), ([13, 21], [5, 8])],
                         ids=["decode", "extend"])
def test_dispatcher_triton_backend(seq_lens, q_lens):
    """paged_attention() (the model's path: the wrappers' checks skipped) with the Triton
    backend writes the new K/V and attends like the torch backend, on a decode step and on a
    prefill step whose chunks end each sequence."""
    torch.manual_seed(len(q_lens) + sum(q_lens))
    num_kv_heads, head_dim, block_size = 2, 16, 8
    k_cache, v_cache, bt, seq_lens_t = make_paged_kv(seq_lens, num_kv_heads, head_dim,
                                                     block_size, torch.float32)
    # the last q_len tokens of each sequence are new this step
    slots = torch.cat([
        torch.stack([bt[i, p // block_size].long() * block_size + p % block_size
                     for p in range(n - q, n)])
        for i, (n, q) in enumerate(zip(seq_lens, q_lens))])
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = attention.AttentionMetadata(
        slot_mapping=slots, block_tables=bt, seq_lens=seq_lens_t, cu_seqlens_q=cu,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), backend="triton")
    num_tokens = sum(q_lens)
    query = torch.randn(num_tokens, 4, head_dim)
    key, value = torch.randn(num_tokens, 2, head_dim), torch.randn(num_tokens, 2, head_dim)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    out = attention.paged_attention(query, key, value, k_cache, v_cache, meta, 0.25)
    meta.backend = "torch"
    expected = attention.paged_attention(query, key, value, k_ref, v_ref, meta, 0.25)
    assert_close(out, expected, torch.float32)
    torch.testing.assert_close(k_cache, k_ref, equal_nan=True)  # NaN: unused slots
    torch.testing.assert_close(v_cache, v_ref, equal_nan=True)


def test_split_heuristic():
    # a full GPU needs no split; one sequence on a 132-SM GPU is split, bounded by length
    assert tri.choose_num_splits(256, 8, 1024, 132) == 1
    assert tri.choose_num_splits(64, 8, 4096, 132) == 1  # 512 programs >= 3 per SM
    assert tri.choose_num_splits(8, 8, 32768, 132) == 8  # 64 programs -> ~4 per SM
    assert tri.choose_num_splits(64, 2, 2048, 132) == 4  # Qwen2-0.5B: 128 programs
    assert tri.choose_num_splits(1, 8, 32768, 132) == 64  # capped at MAX_SPLITS
    assert tri.choose_num_splits(1, 8, 512, 132) == 2  # capped by partition length
    assert tri.choose_num_splits(1, 8, 1000, 132) == 2  # 3 by length, rounded down
    assert tri.choose_num_splits(1, 1, 100, 132) == 1
    # the FP8 cache's one-warp warp-tile programs aim at 8 per SM (_decode_launch_config)
    assert tri.choose_num_splits(64, 2, 4096, 132, programs_per_sm=8) == 8
    assert tri.choose_num_splits(8, 8, 8192, 132, programs_per_sm=8) == 16
    assert tri.choose_num_splits(64, 8, 4096, 132, programs_per_sm=8) == 1  # still >= 3
    # ... with partitions down to 64 tokens: batch 1 fills the GPU (16 at 256 tokens)
    assert tri.choose_num_splits(1, 8, 4096, 132, 8, min_partition_tokens=64) == 64
    assert tri.choose_num_splits(1, 8, 4096, 132, 8) == 16
    assert tri.choose_num_splits(1, 2, 1000, 132, 8, min_partition_tokens=64) == 8  # 15 by length
    assert tri.choose_num_splits(64, 2, 2048, 132, 8, min_partition_tokens=64) == 8  # as before
    plan = tri.decode_launch_plan(1, 8, 128, True, 4096, 132)  # the FP8 default uses both
    assert plan[1:] == (1, 64)
    assert tri.decode_launch_plan(1, 8, 128, False, 4096, 132)[1:] == (0, 16)  # bf16: 256
    # 16-bit caches at head_dim 64: warp tiles, 4 programs per SM, partitions down to 32
    assert tri.decode_launch_plan(1, 2, 64, False, 512, 132)[1:] == (1, 16)
    assert tri.decode_launch_plan(64, 2, 64, False, 2048, 132)[1:] == (1, 4)
    assert tri.decode_launch_plan(256, 2, 64, False, 640, 132)[1:] == (0, 1)  # unsplit: not
    # ... not an fp32 cache (kv_bytes 4): `_decode_kernel`'s 256-token partitions
    assert tri.decode_launch_plan(1, 2, 64, False, 512, 132, kv_bytes=4)[1:] == (0, 2)
    # a tuning config inherits the keys it leaves out from the default launch's
    warp = {"BLOCK_N": 64, "num_warps": 2, "num_stages": 5, "warp_tiles": 1}
    assert tri.decode_launch_plan(1, 8, 128, True, 4096, 132, config=warp)[1:] == (1, 64)
    plain = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    assert tri.decode_launch_plan(1, 8, 128, True, 4096, 132, config=plain)[1:] == (0, 16)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"min_partition_tokens={bad!r}"):
            tri.decode_launch_plan(1, 8, 128, True, 4096, 132,
                                   config={**warp, "min_partition_tokens": bad})


def test_reduce_heads_per_program():
    """The split-K reduce's query heads per program: the fewest programs up to one per SM,
    within REDUCE_TILE_ELEMENTS partials per program."""
    assert tri.reduce_heads_per_program(64, 14, 8, 64, 132) == 8  # 128 programs
    assert tri.reduce_heads_per_program(16, 14, 32, 64, 132) == 2  # 112
    assert tri.reduce_heads_per_program(1, 14, 64, 64, 132) == 1  # 14 already
    assert tri.reduce_heads_per_program(256, 2, 2, 64, 132) == 2  # at most the heads
    assert tri.reduce_heads_per_program(64, 32, 64, 128, 132) == 1  # tile limit
    assert tri.reduce_heads_per_program(64, 32, 8, 128, 132) == 8  # 8 * 8 * 128 = 8192


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reduce_heads_blocks_combine_alike(dtype):
    """The split-K reduce with 1 to 16 query heads per program (14 heads: the last block
    partly masked) gives the same output bit for bit, and the reference's."""
    lens = [1, 15, 16, 17, 64, 100]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, 2, 32, 16, dtype)
    query = torch.randn(len(lens), 14, 32).to(dtype)
    expected = ref.paged_attention_decode_reference(query.float(), k_cache.float(),
                                                    v_cache.float(), bt, seq_lens, 0.2)
    outs = [tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.2, 3,
                                              config={"reduce_heads": heads})
            for heads in (1, 2, 4, 8, 16)]
    assert_close(outs[0], expected, dtype)
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    for bad in (3, 0, 2.0):
        with pytest.raises(ValueError, match=f"reduce_heads={bad!r}"):
            tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.2, 3,
                                              config={"reduce_heads": bad})


def test_contract_errors():
    k_cache, v_cache, bt, seq_lens = make_paged_kv([5], 1, 16, 8, torch.float16)
    query = torch.randn(1, 2, 16).half()
    with pytest.raises(ValueError, match="query.dtype"):
        tri.paged_attention_decode_triton(query.float(), k_cache, v_cache, bt, seq_lens, 1.0)
    with pytest.raises(ValueError, match="block_tables.dtype"):
        tri.paged_attention_decode_triton(query, k_cache, v_cache, bt.long(), seq_lens, 1.0)
    with pytest.raises(ValueError, match="stride"):
        strided = k_cache.transpose(2, 3)
        tri.paged_attention_decode_triton(query, strided, strided, bt, seq_lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        tri.paged_attention_decode_triton(query[..., :8].contiguous(),
                                          k_cache[..., :8].contiguous(),
                                          v_cache[..., :8].contiguous(), bt, seq_lens, 1.0)


def test_launch_falls_back_when_shared_memory_runs_out():
    from triton.runtime.errors import OutOfResources

    from pagedrt.ops.triton_utils import launch_first_fitting

    tried = []

    def launch(cfg):
        tried.append(cfg["BLOCK_M"])
        if cfg["BLOCK_M"] > 64:
            raise OutOfResources(263424, 232448, "shared memory")

    configs = [{"BLOCK_M": 256}, {"BLOCK_M": 128}, {"BLOCK_M": 64}, {"BLOCK_M": 32}]
    launch_first_fitting(("test", 1), configs, launch)
    launch_first_fitting(("test", 1), configs, launch)  # remembered: starts at the fitting one
    assert tried == [256, 128, 64, 64]
    with pytest.raises(ValueError, match="shared memory"):
        launch_first_fitting(("test", 2), configs[:2], launch)
