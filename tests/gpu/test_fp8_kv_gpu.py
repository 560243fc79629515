"""The FP8 KV cache on a CUDA GPU (compiled Triton kernels, CUDA graphs): the writer gives the
torch reference's bytes and scales exactly (the fused RoPE + write within one e4m3 step), the
attention kernels agree with the reference over the same FP8 cache, and the engine runs FP8
caches through graphs, forks, swap and prefix hits.
Run on the H200 with `python3 -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.kv.kv_cache import KVCacheSpec
from pagedrt.models import layers
from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri
from pagedrt.ops.fp8 import FP8_DTYPE
from pagedrt.ops.triton_utils import to_v_dim_major

CUDA = torch.device("cuda")


def _fp8_caches(num_blocks, block_size, num_kv_heads, head_dim):
    """NaN bytes and NaN scales everywhere: any slot the kernels should not read is NaN. V is
    stored dim-major (KVCacheSpec.v_dim_major, the default), the layout whose
    loads and stores differ most from K's."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, 0x7F, dtype=torch.uint8, device=CUDA).view(FP8_DTYPE)
              for _ in range(2)]
    caches[1] = to_v_dim_major(caches[1])
    scales = [torch.full((num_blocks, num_kv_heads, block_size), float("nan"), device=CUDA)
              for _ in range(2)]
    return caches + scales


def _same(actual, expected):
    for got, want in zip(actual, expected):
        if got.dtype == FP8_DTYPE:
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        else:
            assert torch.equal(got.nan_to_num(), want.nan_to_num())


def _close(actual, expected):
    """Two FP8 caches written from keys computed by two kernels (the fused RoPE and the RoPE
    kernel), whose fp32 arithmetic may be contracted differently: the dequantized values
    within one e4m3 step (relative 2^-3 for normal codes, the subnormal step 2^-9 x scale
    below 2^-6 x scale), and nearly every byte equal."""
    for cache, scales, want_cache, want_scales in ((actual[0], actual[2], expected[0],
                                                    expected[2]),
                                                   (actual[1], actual[3], expected[1],
                                                    expected[3])):
        scale = scales.transpose(1, 2)[..., None].nan_to_num()
        got = (cache.float() * scale).nan_to_num()
        want = (want_cache.float() * want_scales.transpose(1, 2)[..., None]).nan_to_num()
        step = torch.maximum(want.abs() * 2**-3, scale * 2**-9)
        bad = (got - want).abs() > step * 1.0001
        assert not bad.any(), f"{int(bad.sum())} values differ by more than one e4m3 step"
        same = (cache.view(torch.uint8) == want_cache.view(torch.uint8)).float().mean().item()
        assert same > 0.99, f"{same:.2%} of the bytes are equal"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_write_kv_fp8_bytes_on_gpu(dtype):
    """The compiled writer (integer rounding, uint8 stores) = torch's cast, bit for bit."""
    torch.manual_seed(0)
    num_tokens, num_kv_heads, head_dim, block_size, num_blocks = 300, 8, 128, 16, 40
    magnitude = torch.exp2(torch.randint(-10, 10, (num_tokens, num_kv_heads, 1),
                                         device=CUDA).float())
    key = (torch.randn(num_tokens, num_kv_heads, head_dim, device=CUDA) * magnitude).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, device=CUDA).to(dtype)
    slots = torch.randperm(num_blocks * block_size, device=CUDA)[:num_tokens]
    slots[::7] = -1
    actual = _fp8_caches(num_blocks, block_size, num_kv_heads, head_dim)
    expected = [t.clone() for t in actual]
    ref.write_kv_reference(key, value, *expected[:2], slots, *expected[2:])
    tri.write_kv_triton(key, value, *actual[:2], slots, k_scales=actual[2], v_scales=actual[3])
    _same(actual, expected)


@pytest.mark.parametrize("head_dim, num_heads, num_kv_heads", [(128, 32, 8), (64, 14, 2)])
def test_fused_rope_write_fp8_on_gpu(head_dim, num_heads, num_kv_heads):
    """Fused RoPE + FP8 write = the Triton RoPE kernel, then the reference writer (bf16)."""
    from pagedrt.ops.fused_triton import rotary_triton, rotary_write_kv_triton

    torch.manual_seed(1)
    num_tokens, block_size, num_blocks = 200, 16, 20
    rope = layers.RotaryEmbedding(head_dim, 4096, base=10000.0).to(CUDA)
    q = torch.randn(num_tokens, num_heads, head_dim, device=CUDA, dtype=torch.bfloat16)
    k = (torch.randn(num_tokens, num_kv_heads, head_dim, device=CUDA) * 8).bfloat16()
    v = torch.randn(num_tokens, num_kv_heads, head_dim, device=CUDA, dtype=torch.bfloat16)
    positions = torch.randint(0, 4096, (num_tokens,), device=CUDA)
    slots = torch.randperm(num_blocks * block_size, device=CUDA)[:num_tokens]
    actual = _fp8_caches(num_blocks, block_size, num_kv_heads, head_dim)
    expected = [t.clone() for t in actual]
    _, rotated = rotary_triton(positions, q.clone(), k.clone(), rope.cos_sin_cache)
    ref.write_kv_reference(rotated, v, *expected[:2], slots, *expected[2:])
    rotary_write_kv_triton(positions, q, k, v, rope.cos_sin_cache, *actual[:2], slots,
                           k_scales=actual[2], v_scales=actual[3])
    _close(actual, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_layer_fp8_on_gpu_matches_torch_path(dtype):
    """LlamaAttention on CUDA over an FP8 cache: the fused RoPE + quantizing write and the
    Triton attention against the same layer with torch attention (RoPE alone, the reference
    writer and attention): the same output and cache."""
    from tiny_model import TINY_CONFIG

    from pagedrt.models.llama import LlamaAttention
    from pagedrt.ops.attention import AttentionMetadata, KVCacheLayer

    torch.manual_seed(5)
    attn = LlamaAttention(TINY_CONFIG).to(CUDA, dtype)
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(torch.randn(param.shape) * 0.2)
    kvh, hd = TINY_CONFIG.num_key_value_heads, TINY_CONFIG.head_dim
    caches = KVCacheLayer(*_fp8_caches(8, 4, kvh, hd))
    ref_caches = KVCacheLayer(*[t.clone() for t in caches])
    x = torch.randn(6, TINY_CONFIG.hidden_size, device=CUDA, dtype=dtype)
    positions = torch.tensor([0, 1, 2, 0, 1, 0], device=CUDA)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([8, 9, 10, 20, 21, -1], device=CUDA),
        block_tables=torch.tensor([[2, 0], [5, 0]], dtype=torch.int32, device=CUDA),
        seq_lens=torch.tensor([3, 2], dtype=torch.int32, device=CUDA),
        cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32, device=CUDA),
        max_query_len=3, max_seq_len=3, backend="triton")
    with torch.no_grad():
        actual = attn(positions, x, caches, meta)
        meta.backend = "torch"
        expected = attn(positions, x, ref_caches, meta)
    # bf16: the two attention paths round their outputs differently before o_proj's sum
    tol = {"rtol": 2e-2, "atol": 5e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4,
                                                                         "atol": 1e-5}
    torch.testing.assert_close(actual[:5], expected[:5], **tol)
    _close(caches, ref_caches)


def _paged_fp8(seq_lens, num_kv_heads, head_dim, block_size):
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    caches = _fp8_caches(num_blocks, block_size, num_kv_heads, head_dim)
    perm = torch.randperm(num_blocks, device=CUDA)
    tables = torch.full((len(seq_lens), max(blocks_per_seq)), int(perm[-1]), dtype=torch.int32,
                        device=CUDA)
    used = 0
    for i, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        ids = perm[used:used + nb]
        used += nb
        tables[i, :nb] = ids.int()
        slots = (ids[:, None] * block_size + torch.arange(block_size, device=CUDA)).flatten()[:n]
        mag = torch.exp2(torch.randint(-4, 5, (n, num_kv_heads, 1), device=CUDA).float())
        ref.write_kv_reference(torch.randn(n, num_kv_heads, head_dim, device=CUDA) * mag,
                               torch.randn(n, num_kv_heads, head_dim, device=CUDA),
                               caches[0], caches[1], slots, caches[2], caches[3])
    return caches, tables, torch.tensor(seq_lens, dtype=torch.int32, device=CUDA)


def _prefill_queries(num_heads, head_dim, dtype):
    """Query chunks of 1, 16, 5, 300, 1 and 77 tokens for `_paged_fp8`'s six sequences:
    (query [402, num_heads, head_dim] of `dtype`, cu_seqlens_q [7] int32), on the GPU."""
    q_lens = [1, 16, 5, 300, 1, 77]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=CUDA)
    return torch.randn(sum(q_lens), num_heads, head_dim, device=CUDA).to(dtype), cu


@pytest.mark.parametrize("group, query_dtype", [(1, torch.bfloat16), (4, torch.float32),
                                                (7, torch.bfloat16)])
def test_fp8_attention_on_gpu_matches_reference(group, query_dtype):
    """Decode (split and unsplit, 4096+ tokens) and extend over one FP8 cache."""
    torch.manual_seed(group)
    num_kv_heads, head_dim, block_size = 2, 128, 16
    lens = [1, 16, 17, 4096, 4097, 300]
    caches, tables, seq_lens = _paged_fp8(lens, num_kv_heads, head_dim, block_size)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim, device=CUDA).to(query_dtype)
    tol = {"rtol": 2e-2, "atol": 2e-2} if query_dtype == torch.bfloat16 else {"rtol": 1e-4,
                                                                               "atol": 1e-4}
    expected = ref.paged_attention_decode_reference(query, caches[0], caches[1], tables,
                                                    seq_lens, head_dim ** -0.5, k_scales=caches[2],
                                                    v_scales=caches[3])
    for num_splits in (1, None, 8):
        out = tri.paged_attention_decode_triton(query, caches[0], caches[1], tables, seq_lens,
                                                head_dim ** -0.5, num_splits=num_splits,
                                                k_scales=caches[2], v_scales=caches[3])
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), expected.float(), **tol)
    query, cu = _prefill_queries(num_kv_heads * group, head_dim, query_dtype)
    expected = ref.paged_attention_extend_reference(query, caches[0], caches[1], tables, cu,
                                                    seq_lens, head_dim ** -0.5, k_scales=caches[2],
                                                    v_scales=caches[3])
    out = tri.paged_attention_extend_triton(query, caches[0], caches[1], tables, cu, seq_lens,
                                            head_dim ** -0.5, k_scales=caches[2],
                                            v_scales=caches[3])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected.float(), **tol)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 7])
def test_fp8_decode_launches_on_gpu_match_reference(head_dim, group):
    """The FP8 decode launches compiled: the default (warp tiles, BLOCK_N 32, one warp), the
    warp tiles at BLOCK_N 64 / 2 warps and over both KV heads in one program (warp_tiles 2),
    `_decode_kernel`'s FP8 config, and the default under
    a sliding window (which runs `_decode_kernel`), bf16 queries, split and unsplit, with
    lengths at 32-token tile edges and past 4096 (group 4 at head_dim 128 runs the default
    in test_fp8_attention_on_gpu_matches_reference)."""
    torch.manual_seed(100 + group + head_dim)
    num_kv_heads, block_size = 2, 16
    lens = [1, 31, 32, 33, 4096, 4129, 700]
    caches, tables, seq_lens = _paged_fp8(lens, num_kv_heads, head_dim, block_size)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim, device=CUDA).bfloat16()
    launches = [(None, None), ({"BLOCK_N": 64, "num_warps": 2, "num_stages": 5,
                                "warp_tiles": 1}, None),
                (tri._decode_launch_config(head_dim, 1, warp_tiles=False), None), (None, 1000)]
    for config, window in launches:
        expected = ref.paged_attention_decode_reference(
            query, caches[0], caches[1], tables, seq_lens, head_dim ** -0.5,
            sliding_window=window, k_scales=caches[2], v_scales=caches[3])
        for num_splits in (1, None):
            out = tri.paged_attention_decode_triton(
                query, caches[0], caches[1], tables, seq_lens, head_dim ** -0.5,
                num_splits=num_splits, config=config, sliding_window=window,
                k_scales=caches[2], v_scales=caches[3])
            assert torch.isfinite(out).all(), (config, num_splits, window)
            where = f"{config} {num_splits} {window}"
            torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2,
                                       msg=lambda m, at=where: f"{at}: {m}")


@pytest.mark.parametrize("group, query_dtype", [(1, torch.bfloat16), (4, torch.bfloat16),
                                                (7, torch.float32)])
def test_fp8_prefill_reads_the_written_rows_on_gpu(group, query_dtype):
    """FRESH_CHUNK_KV compiled: the chunks' rows (of `_paged_fp8`'s sequences, the last
    q_len tokens each, 4096 and 4097 among them) as `write_kv_triton` with round_rows leaves
    them. Reading each chunk's keys from those rows, from the cache, and the reference: the
    same attention within the query dtype's rounding."""
    torch.manual_seed(group)
    num_kv_heads, head_dim, block_size = 2, 128, 16
    lens = [1, 16, 17, 4096, 4097, 300]
    q_lens = [1, 16, 5, 4096, 1, 77]  # whole prompts, chunks over prefixes, one token
    caches, tables, seq_lens = _paged_fp8(lens, num_kv_heads, head_dim, block_size)
    slots = torch.cat([(tables[i].long()[:, None] * block_size
                        + torch.arange(block_size, device=CUDA)).flatten()[n - q:n]
                       for i, (n, q) in enumerate(zip(lens, q_lens))])
    rows = [torch.randn(len(slots), num_kv_heads, head_dim, device=CUDA).to(query_dtype)
            for _ in range(2)]
    tri.write_kv_triton(*rows, caches[0], caches[1], slots, k_scales=caches[2],
                        v_scales=caches[3], round_rows=True)
    held = [(c[slots // block_size].float() * s.transpose(1, 2)[slots // block_size]
             [..., None])[torch.arange(len(slots), device=CUDA), slots % block_size]
            for c, s in ((caches[0], caches[2]), (caches[1], caches[3]))]
    for row, want in zip(rows, held):  # the rows are the cache's values, rounded once
        assert torch.equal(row, want.to(query_dtype))
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=CUDA)
    query = torch.randn(len(slots), num_kv_heads * group, head_dim, device=CUDA)
    query = query.to(query_dtype)
    args = (query, caches[0], caches[1], tables, cu, seq_lens, head_dim ** -0.5)
    scales = {"k_scales": caches[2], "v_scales": caches[3]}
    fresh = tri.paged_attention_extend_triton(*args, key=rows[0], value=rows[1], **scales)
    from_cache = tri.paged_attention_extend_triton(*args, **scales)
    expected = ref.paged_attention_extend_reference(*args, key=rows[0], value=rows[1], **scales)
    tol = {"rtol": 2e-2, "atol": 2e-2} if query_dtype == torch.bfloat16 else {"rtol": 1e-4,
                                                                               "atol": 1e-4}
    assert torch.isfinite(fresh).all()
    torch.testing.assert_close(fresh.float(), from_cache.float(), **tol)
    torch.testing.assert_close(fresh.float(), expected.float(), **tol)


def _tiny_on_cuda():
    loaded = build_tiny_llama(seed=0)
    return loaded._replace(model=loaded.model.to(CUDA))


def test_fp8_engine_on_gpu_graphs_forks_swap_prefix():
    """The engine with an FP8 cache on CUDA: CUDA-graph decode gives the eager tokens; forks
    (copy-on-write), preemption by swap and prefix-cache hits give a roomy run's tokens."""
    tiny = _tiny_on_cuda()
    rng = random.Random(0)
    shared = [rng.randrange(384) for _ in range(24)]
    prompts = [shared + [rng.randrange(384) for _ in range(rng.randint(3, 30))]
               for _ in range(8)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def tokens(llm, params=greedy):
        return [list(c.token_ids) for o in llm.generate(prompts, params, use_tqdm=False)
                for c in o.outputs]

    eager = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=256, block_size=8, max_num_seqs=16,
                enforce_eager=True)
    expected = tokens(eager)
    graphs = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=256, block_size=8, max_num_seqs=16)
    assert graphs.stats()["kv_cache_dtype"] == "fp8_e4m3"
    assert tokens(graphs) == expected  # graphs, prefix hits (shared 24 tokens)
    assert graphs.stats()["prefix_cache_hits"] > 0
    forked = tokens(graphs, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=2))
    assert forked == [t for t in expected for _ in range(2)]
    assert graphs.stats()["num_cow_copies"] > 0
    spec = KVCacheSpec.for_model(tiny.model_config, 8, FP8_DTYPE)
    tight = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=24, block_size=8, max_num_seqs=16,
                max_num_batched_tokens=64, preemption_mode="swap",
                swap_space_bytes=64 * spec.bytes_per_block)
    assert tokens(tight) == expected
    assert tight.stats()["num_swapped_in_blocks"] > 0
    tight.llm_engine.check_integrity()


def test_fp8_cache_holds_about_twice_the_blocks_of_bf16():
    """KV sizing from device memory (gpu_memory_utilization): the same budget holds 1.94x the
    blocks of Llama-3-8B's bf16 cache in FP8 (2 * 128 bytes per head and token against
    128 + 4)."""
    from pagedrt.config import EngineConfig
    from pagedrt.kv.kv_cache import num_blocks_for_budget

    config = EngineConfig(gpu_memory_utilization=0.5)
    blocks = {dtype: num_blocks_for_budget(KVCacheSpec(32, 8, 128, 16, dtype), config, CUDA)
              for dtype in (torch.bfloat16, FP8_DTYPE)}
    assert 1.93 < blocks[FP8_DTYPE] / blocks[torch.bfloat16] < 1.94, blocks


@pytest.mark.parametrize("group, query_dtype", [(4, torch.bfloat16), (7, torch.float32)])
def test_fp8_prefill_products_on_gpu_within_e4m3_rounding(group, query_dtype, monkeypatch):
    """PAGEDRT_FP8_PREFILL_MMA=1 (opt-in, untimed): the extend kernel compiled with FP8
    products (query and probabilities rounded to e4m3, FP8 warpgroup MMA) against the
    reference: finite, and an error of e4m3 rounding, well above the exact path's. On these
    keys, of magnitudes 2^-4 .. 2^4 (scores up to ~16), the interpreter measured 16% rms of
    the output at shorter lengths (5% with unit keys, tests/test_fp8_kv_kernels.py): rounding
    the query to 3 mantissa bits moves large scores by whole units. That is the accuracy
    question this variant has to answer on a real model before it can be a default."""
    monkeypatch.setenv("PAGEDRT_FP8_PREFILL_MMA", "1")
    torch.manual_seed(group)
    num_kv_heads, head_dim, block_size = 2, 128, 16
    lens = [1, 16, 17, 4096, 4097, 300]
    caches, tables, seq_lens = _paged_fp8(lens, num_kv_heads, head_dim, block_size)
    query, cu = _prefill_queries(num_kv_heads * group, head_dim, query_dtype)
    expected = ref.paged_attention_extend_reference(query, caches[0], caches[1], tables, cu,
                                                    seq_lens, head_dim ** -0.5, k_scales=caches[2],
                                                    v_scales=caches[3]).float()
    out = tri.paged_attention_extend_triton(query, caches[0], caches[1], tables, cu, seq_lens,
                                            head_dim ** -0.5, k_scales=caches[2],
                                            v_scales=caches[3]).float()
    assert torch.isfinite(out).all()
    rms = ((out - expected).pow(2).mean() / expected.pow(2).mean()).sqrt().item()
    assert 0.01 < rms < 0.3, rms
