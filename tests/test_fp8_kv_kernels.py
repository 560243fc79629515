"""FP8 KV cache kernels on CPU under TRITON_INTERPRET=1, against the torch reference that
quantizes the same way (`pagedrt.ops.fp8`).

The writers must produce the reference's bytes and scales exactly (both divide with IEEE
round-to-nearest, then round to e4m3 to nearest-even). The attention kernels
read fp8 caches filled by the reference writer: every unused slot holds the NaN byte 0x7F and
a NaN scale, block tables are shuffled, and tokens differ in magnitude by up to 2^12 so that
each has its own scale. Under the interpreter the kernels upcast K/V to fp32 before tl.dot
(the UPCAST flag: its bf16 dot is wrong); fp8 K/V are read with a plain `tl.load` of the
float8 pointer, which the interpreter converts exactly for every finite code (its fp32 ->
fp8 cast is wrong, which is why the writers compute the bytes themselves: fp8_triton.py).
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

import triton
import triton.language as tl

from pagedrt.models import layers
from pagedrt.ops import attention
from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri
from pagedrt.ops.fp8 import FP8_DTYPE, dequantize_fp8, fp8_scale, quantize_fp8
from pagedrt.ops.fp8_triton import fp8_e4m3_bits, fp8_row_scale
from pagedrt.ops.fused_triton import rotary_write_kv_triton
from pagedrt.ops.triton_utils import to_v_dim_major

NAN_BYTE = 0x7F  # float8_e4m3fn NaN


@triton.jit
def _bits_kernel(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, fp8_e4m3_bits(tl.load(x_ptr + offs)))


@triton.jit
def _scale_kernel(amax_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, fp8_row_scale(tl.load(amax_ptr + offs)))


def test_fp8_bits_are_torchs_round_to_nearest_even():
    """Every finite e4m3 value, each midpoint between neighbours (ties to even), the floats
    just either side of each midpoint, +-0, and random values over 2^-16 .. 448."""
    torch.manual_seed(0)
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(FP8_DTYPE).float()  # 0 .. 448
    mids = (codes[1:] + codes[:-1]) / 2
    below = torch.nextafter(mids, torch.zeros(()))
    above = torch.nextafter(mids, torch.full((), 1000.0))
    rand = torch.randn(4096) * torch.exp2(torch.randint(-16, 9, (4096,)).float())
    x = torch.cat([codes, mids, below, above, rand.clamp(-448, 448), torch.tensor([-0.0])])
    x = torch.cat([x, -x])
    n = triton.next_power_of_2(len(x))
    x = torch.cat([x, torch.zeros(n - len(x))])
    out = torch.empty(n, dtype=torch.uint8)
    _bits_kernel[(1,)](x, out, N=n)
    expected = x.to(FP8_DTYPE).view(torch.uint8)
    bad = (out != expected).nonzero().flatten()
    assert len(bad) == 0, f"{len(bad)} values differ, e.g. {x[bad[:5]].tolist()}"


def test_scales_are_amax_over_448_correctly_rounded():
    """The kernels' scale (tl.math.div_rn) is torch's amax / 448 bit for bit, down to the
    all-zero and subnormal rows (clamped to the smallest normal float)."""
    amax = torch.cat([torch.tensor([0.0, 1e-45, 1e-38, 1.0, 1.75, 448.0, 448.1, 3.0e38]),
                      torch.rand(1016) * torch.exp2(torch.randint(-40, 40, (1016,)).float())])
    out = torch.empty_like(amax)
    _scale_kernel[(1,)](amax, out, N=len(amax))
    expected = fp8_scale(amax)
    assert torch.equal(out, expected)
    assert torch.equal(expected[3:], amax[3:] / 448)
    assert (expected > 0).all()


def test_quantize_round_trip_error():
    """Relative error of e4m3 (3 mantissa bits): at most 2^-4 for values in the normal range
    (above 2^-6 * scale); the largest value of each row is stored as 448, exactly."""
    torch.manual_seed(1)
    x = torch.randn(64, 4, 32) * torch.exp2(torch.randint(-10, 10, (64, 4, 1)).float())
    values, scales = quantize_fp8(x)
    assert values.dtype == FP8_DTYPE and scales.shape == (64, 4)
    back = dequantize_fp8(values, scales)
    normal = x.abs() >= scales[..., None] * 2**-6
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max() <= 2**-4
    assert (values.float().abs().amax(-1) == 448).all()
    torch.testing.assert_close(back.abs().amax(-1), x.abs().amax(-1), rtol=1e-6, atol=0)


def fp8_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, spare_blocks=3, seed=0,
                 v_dim_major=True, spread=True):
    """FP8 caches with each sequence's K/V, written by the reference writer into shuffled
    blocks; unused slots keep NaN bytes and NaN scales. Tokens have magnitudes 2^-6 .. 2^6
    (`spread`; else 1, as in a model's cache).
    (The interpreter decodes the NaN byte 0x7F as 480, so here a read of an unused slot's
    bytes shows only through its NaN scale; tests/gpu/test_fp8_kv_gpu.py, where 0x7F is NaN,
    catches the bytes too.)
    V is stored dim-major (the engine's default layout) unless `v_dim_major`
    is False; test_v_layouts_give_the_same_attention checks both layouts agree.

    Returns k_cache, v_cache, k_scales, v_scales, block_tables [num_seqs, max_blocks] int32,
    seq_lens int32.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [max(1, -(-n // block_size)) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, NAN_BYTE, dtype=torch.uint8).view(FP8_DTYPE)
    v_cache = torch.full(shape, NAN_BYTE, dtype=torch.uint8).view(FP8_DTYPE)
    if v_dim_major:
        v_cache = to_v_dim_major(v_cache)
    k_scales = torch.full((num_blocks, num_kv_heads, block_size), float("nan"))
    v_scales = torch.full((num_blocks, num_kv_heads, block_size), float("nan"))
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.full((len(seq_lens), max(blocks_per_seq) + 1), int(perm[-1]),
                              dtype=torch.int32)
    used = 0
    for i, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        ids = perm[used:used + nb]
        used += nb
        block_tables[i, :nb] = ids.int()
        slots = (ids[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        magnitude = torch.exp2(torch.randint(-6, 7, (n, num_kv_heads, 1), generator=gen).float())
        if not spread:
            magnitude = torch.ones_like(magnitude)
        key = torch.randn(n, num_kv_heads, head_dim, generator=gen) * magnitude
        value = torch.randn(n, num_kv_heads, head_dim, generator=gen) * magnitude.flip(0)
        ref.write_kv_reference(key, value, k_cache, v_cache, slots, k_scales, v_scales)
    return (k_cache, v_cache, k_scales, v_scales, block_tables,
            torch.tensor(seq_lens, dtype=torch.int32))


def dequantized_caches(k_cache, v_cache, k_scales, v_scales):
    """fp32 caches holding what the FP8 ones mean (NaN where the FP8 ones are unused)."""
    k = k_cache.float() * k_scales.transpose(1, 2)[..., None]
    v = v_cache.float() * v_scales.transpose(1, 2)[..., None]
    return k, v


def assert_close(out, expected):
    assert torch.isfinite(out).all(), "output has NaN/inf: an unused slot was read"
    err = ((out.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    assert err <= 1e-5, f"max error {err} of the largest output"


def edge_lens(block_size):
    return [1, 15, 16, 17, 2 * block_size - 1, 2 * block_size, 2 * block_size + 1, 65, 100]


def test_reference_attention_reads_what_was_written():
    """The reference over an FP8 cache = the reference over fp32 caches holding the
    dequantized values (the oracle's own dequantization)."""
    lens = [1, 17, 40]
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(lens, 2, 16, 8)
    k32, v32 = dequantized_caches(k_cache, v_cache, k_scales, v_scales)
    query = torch.randn(3, 6, 16)
    out = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.25,
                                               k_scales=k_scales, v_scales=v_scales)
    expected = ref.paged_attention_decode_reference(query, k32, v32, bt, seq_lens, 0.25)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    cu = torch.tensor([0, 1, 6, 20], dtype=torch.int32)
    query = torch.randn(20, 6, 16)
    out = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu, seq_lens, 0.25,
                                               k_scales=k_scales, v_scales=v_scales)
    expected = ref.paged_attention_extend_reference(query, k32, v32, bt, cu, seq_lens, 0.25)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


# every GQA group size 1..8 that the models use, each block size twice (the fp16/bf16/fp32
# caches' full cross product is in test_attention_triton.py; FP8 changes only the loads)
GROUPS_AND_BLOCK_SIZES = [(1, 8), (2, 16), (3, 32), (4, 8), (7, 16), (8, 32)]


@pytest.mark.parametrize("group, block_size", GROUPS_AND_BLOCK_SIZES)
def test_decode_fp8_matches_reference(group, block_size):
    num_kv_heads, head_dim = 2, 32
    lens = edge_lens(block_size)
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(
        lens, num_kv_heads, head_dim, block_size, seed=group * 100 + block_size)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens,
                                                    scale, k_scales=k_scales, v_scales=v_scales)
    # 1: no split; None: heuristic; 2: 65 -> 64 + a one-token partition; 8: empty partitions
    for num_splits in (1, None, 2, 8):
        out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, scale,
                                                num_splits=num_splits, k_scales=k_scales,
                                                v_scales=v_scales)
        assert_close(out, expected)


def test_v_layouts_give_the_same_attention():
    """V in K's layout and dim-major (the engine's FP8 layout) read the same: decode (split and
    not) and extend over an FP8 cache, and decode over an fp32 cache, whose kernels take V's
    strides as given."""
    lens = [1, 16, 17, 40]
    caches = {layout: fp8_paged_kv(lens, 2, 32, 8, seed=4, v_dim_major=layout)
              for layout in (False, True)}
    assert torch.equal(caches[True][1].view(torch.uint8), caches[False][1].view(torch.uint8))
    assert caches[True][1].stride(1) == 1 and caches[False][1].stride(-1) == 1
    query = torch.randn(len(lens), 6, 32)
    q_lens = torch.tensor([1, 3, 17, 2])
    cu = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32)
    prefill = torch.randn(int(q_lens.sum()), 6, 32)
    outs = {}
    for layout, (k, v, ks, vs, bt, seq_lens) in caches.items():
        outs[layout] = [tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.2,
                                                          num_splits=n, k_scales=ks,
                                                          v_scales=vs) for n in (1, 2)]
        outs[layout].append(tri.paged_attention_extend_triton(prefill, k, v, bt, cu, seq_lens,
                                                              0.2, k_scales=ks, v_scales=vs))
    for a, b in zip(outs[True], outs[False]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    k, v, ks, vs, bt, seq_lens = caches[False]
    k32, v32 = dequantized_caches(k, v, ks, vs)
    k32, v32 = k32.nan_to_num(), v32.nan_to_num()
    expected = ref.paged_attention_decode_reference(query, k32, v32, bt, seq_lens, 0.2)
    out = tri.paged_attention_decode_triton(query, k32, to_v_dim_major(v32), bt, seq_lens, 0.2,
                                            num_splits=2)
    assert_close(out, expected)


def test_register_cap_of_the_fp8_launch_reaches_the_kernel_unchanged_results():
    """Where the FP8 cache's decode runs `_decode_kernel` (no warp tiles: a window, fused
    reduce or block-table prefetch), its default caps registers (`maxnreg`, a Triton compile
    option; measured faster on the H200, `_decode_launch_config`), only at head_dim < 128 (at
    128 it runs 5 stages uncapped); a config that names its own cap, or 0 for none, is
    launched with it and reads the same attention (the interpreter takes the option and
    ignores it; tests/gpu/test_fp8_kv_gpu.py runs the capped kernel compiled)."""
    assert tri._decode_launch_config(64, 1, warp_tiles=False)["maxnreg"] == 128
    assert tri._decode_launch_config(128, 1, warp_tiles=False) == {
        "BLOCK_N": 128, "num_warps": 4, "num_stages": 5}
    assert "maxnreg" not in tri._decode_launch_config(256, 1, warp_tiles=False)
    assert "maxnreg" not in tri._decode_launch_config(128, kv_bytes=2)
    for head_dim in (64, 128):  # where it can, FP8 runs the warp-tile kernel
        assert tri._decode_launch_config(head_dim, 1)["warp_tiles"] == 1
    # 16-bit caches only at head_dim 64 (slower at 128 on the H200)
    assert tri._decode_launch_config(64, 2)["warp_tiles"] == 1
    assert "warp_tiles" not in tri._decode_launch_config(128, 2)
    for head_dim in (32, 256):  # head sizes the warp tiles were not measured at
        assert "warp_tiles" not in tri._decode_launch_config(head_dim, 1)
    lens = [1, 16, 17, 40]
    k, v, ks, vs, bt, seq_lens = fp8_paged_kv(lens, 2, 32, 8, seed=6)
    query = torch.randn(len(lens), 6, 32)
    expected = ref.paged_attention_decode_reference(query, k, v, bt, seq_lens, 0.2,
                                                    k_scales=ks, v_scales=vs)
    for cap in (0, 128, None):  # None: _decode_kernel's own FP8 launch at head_dim 32
        cfg = tri._decode_launch_config(32, 1, warp_tiles=False) if cap is None else {
            "BLOCK_N": 16, "num_warps": 4, "num_stages": 2, "maxnreg": cap}
        out = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, 0.2, num_splits=2,
                                                config=cfg, k_scales=ks, v_scales=vs)
        assert_close(out, expected)


def test_strided_caches_read_as_contiguous_ones():
    """The decode kernel reads any view of a cache with its runtime strides: one KV head of a
    two-head cache (a non-contiguous view; fp32, and FP8 with its scales) gives what its
    contiguous copy gives."""
    lens = [1, 16, 17, 40]
    query = torch.randn(len(lens), 3, 32)
    k, v, ks, vs, bt, seq_lens = fp8_paged_kv(lens, 2, 32, 8, seed=5, v_dim_major=False)
    k32, v32 = (x.nan_to_num() for x in dequantized_caches(k, v, ks, vs))
    views = {"fp8": (k[:, :, 1:], v[:, :, 1:], ks[:, 1:], vs[:, 1:]),
             "fp32": (k32[:, :, 1:], v32[:, :, 1:], None, None)}
    for name, (kh, vh, ksh, vsh) in views.items():
        assert not kh.is_contiguous()
        kc, vc, ksc, vsc = (x if x is None else x.contiguous() for x in (kh, vh, ksh, vsh))
        for n in (1, 2):
            out = tri.paged_attention_decode_triton(query, kh, vh, bt, seq_lens, 0.2,
                                                    num_splits=n, k_scales=ksh, v_scales=vsh)
            want = tri.paged_attention_decode_triton(query, kc, vc, bt, seq_lens, 0.2,
                                                     num_splits=n, k_scales=ksc, v_scales=vsc)
            assert torch.isfinite(out).all(), (name, n)
            torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("query_dtype", [torch.bfloat16, torch.float16])
def test_decode_fp8_half_queries_head_dim_64(query_dtype):
    """A 16-bit model over an FP8 cache (Qwen2-0.5B's 14/2 heads x 64)."""
    lens = [1, 33, 64, 97]
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(lens, 2, 64, 16, seed=9)
    query = torch.randn(len(lens), 14, 64).to(query_dtype)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.125,
                                                    k_scales=k_scales, v_scales=v_scales)
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.125,
                                            num_splits=3, k_scales=k_scales, v_scales=v_scales)
    assert out.dtype == query_dtype
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)  # one ulp of the output


@pytest.mark.parametrize("group, block_size", GROUPS_AND_BLOCK_SIZES)
def test_extend_fp8_matches_reference(group, block_size):
    num_kv_heads, head_dim = 2, 32
    # (cached prefix, query length): prefixes 0, 16, 17 x lengths 1, 5, bs, bs + 1
    pairs = [(p, q) for p in (0, 16, 17) for q in (1, 5, block_size, block_size + 1)]
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(
        [p + q for p, q in pairs], num_kv_heads, head_dim, block_size, seed=group + block_size)
    q_lens = torch.tensor([q for _, q in pairs])
    cu_seqlens_q = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32)
    query = torch.randn(int(q_lens.sum()), num_kv_heads * group, head_dim)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu_seqlens_q,
                                                    seq_lens, scale, k_scales=k_scales,
                                                    v_scales=v_scales)
    out = tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu_seqlens_q, seq_lens,
                                            scale, k_scales=k_scales, v_scales=v_scales)
    assert_close(out, expected)


@pytest.mark.parametrize("window", [1, 7, 20])
def test_fp8_with_sliding_window_matches_reference(window):
    """A sliding window over an FP8 cache (decode, split and not, and extend): the kernels
    skip the blocks before the window and read the rest's scales like the reference."""
    num_kv_heads, head_dim, block_size = 2, 32, 8
    lens = [1, 9, 17, 40, 65]
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(
        lens, num_kv_heads, head_dim, block_size, seed=window)
    scales = {"k_scales": k_scales, "v_scales": v_scales}
    query = torch.randn(len(lens), num_kv_heads * 4, head_dim)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                                    sliding_window=window, **scales)
    for num_splits in (1, 3):
        out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                                num_splits=num_splits, sliding_window=window,
                                                **scales)
        assert_close(out, expected)
    q_lens = torch.tensor([1, 5, 9, 1, 30])
    cu = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32)
    query = torch.randn(int(q_lens.sum()), num_kv_heads * 4, head_dim)
    expected = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu, seq_lens,
                                                    0.2, sliding_window=window, **scales)
    out = tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu, seq_lens, 0.2,
                                            sliding_window=window, **scales)
    assert_close(out, expected)


@pytest.mark.parametrize("query_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", [None, 7])
def test_extend_fp8_half_queries(query_dtype, window):
    """A 16-bit model's prefill over an FP8 cache: the kernels multiply in fp16 (the query
    divided by 64, each value tile's scales over their largest), as on the GPU; values span
    2^-6 .. 2^6 per token, so the per-tile scale normalisation is exercised."""
    num_kv_heads, head_dim, block_size = 2, 64, 16
    pairs = [(0, 1), (0, 33), (17, 5), (40, 16), (3, 1)]
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(
        [p + q for p, q in pairs], num_kv_heads, head_dim, block_size, seed=31)
    q_lens = torch.tensor([q for _, q in pairs])
    cu = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32)
    query = (torch.randn(int(q_lens.sum()), 7 * num_kv_heads, head_dim) * 3).to(query_dtype)
    scales = {"k_scales": k_scales, "v_scales": v_scales, "sliding_window": window}
    expected = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu, seq_lens,
                                                    0.125, **scales)
    out = tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu, seq_lens, 0.125,
                                            **scales)
    assert out.dtype == query_dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)


def _chunk_kv(num_tokens, num_kv_heads, head_dim, dtype, seed):
    """A step's own K and V, [num_tokens, num_kv_heads, head_dim], as views of one packed
    qkv-like row (strided, head_dim contiguous, as the model's split of its QKV projection),
    magnitudes 2^-3 .. 2^3 per token."""
    gen = torch.Generator().manual_seed(seed)
    width = num_kv_heads * head_dim
    rows = torch.randn(num_tokens, 3 * width, generator=gen)
    rows *= torch.exp2(torch.randint(-3, 4, (num_tokens, 1), generator=gen).float())
    rows = rows.to(dtype)
    key = rows[:, width:2 * width].view(num_tokens, num_kv_heads, head_dim)
    value = rows[:, 2 * width:].view(num_tokens, num_kv_heads, head_dim)
    return key, value


@pytest.mark.parametrize("group, block_size", [(1, 8), (3, 16), (4, 16), (8, 32)])
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16])
def test_extend_fp8_reads_the_chunks_own_kv_unrounded(group, block_size, query_dtype):
    """FRESH_CHUNK_KV: with the step's key and value passed, each chunk attends to those rows
    (here values unlike the cache's, so a key read from the wrong source shows) and to its
    prefix from the cache. Prefixes 0, one block and one past it, chunks of 1, 5, a block and
    one past it, 2 blocks + 3 (tiles of 16 keys: full, diagonal and masked prefix tiles)."""
    num_kv_heads, head_dim = 2, 32
    pairs = [(p, q) for p in (0, block_size, block_size + 1)
             for q in (1, 5, block_size, block_size + 1, 2 * block_size + 3)]
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(
        [p + q for p, q in pairs], num_kv_heads, head_dim, block_size, seed=group)
    q_lens = torch.tensor([q for _, q in pairs])
    cu = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32)
    num_tokens = int(q_lens.sum())
    gen = torch.Generator().manual_seed(group)
    query = torch.randn(num_tokens, num_kv_heads * group, head_dim, generator=gen)
    query = query.to(query_dtype)
    key, value = _chunk_kv(num_tokens, num_kv_heads, head_dim, query_dtype, seed=group + 50)
    scales = {"k_scales": k_scales, "v_scales": v_scales}
    expected = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu, seq_lens,
                                                    0.2, key=key, value=value, **scales)
    cache_only = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu,
                                                      seq_lens, 0.2, **scales)
    moved = (expected.float() - cache_only.float()).abs().amax(dim=(1, 2))
    no_prefix = int(cu[5])  # the rows of the first five chunks see their own keys alone
    assert (moved[:no_prefix] > 0).all()  # (a prefix key 2^6 strong may outweigh the rest)
    out = tri.paged_attention_extend_triton(query, k_cache, v_cache, bt, cu, seq_lens, 0.2,
                                            key=key, value=value, **scales)
    if query_dtype == torch.float32:
        assert_close(out, expected)
    else:  # fp16 products over the prefix (a 16-bit query's path), bf16 probabilities and
        # output: a few bf16 ulps (2^-8 relative) of the largest output
        assert torch.isfinite(out).all()
        err = (out.float() - expected.float()).abs().max() / expected.float().abs().max()
        assert err < 2e-2, err


def test_extend_fp8_chunk_rows_left_by_the_writer_give_the_cache_only_result():
    """The engine's case: the rows are the ones the writer rounded (round_rows) as it wrote
    the chunk into the cache. Then reading the chunk's keys from them, or from the cache,
    gives the same attention (fp32 rows: to fp32 rounding), for prompts, chunks over a
    cached prefix, and one-token chunks; unrounded rows would not."""
    num_kv_heads, head_dim, block_size = 2, 32, 16
    q_lens, prefixes = [40, 1, 9, 17], [0, 50, 16, 33]
    lens = [p + q for p, q in zip(prefixes, q_lens)]
    k_cache, v_cache, ks, vs, bt, seq_lens = fp8_paged_kv(lens, num_kv_heads, head_dim,
                                                          block_size, seed=7)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    slots = torch.cat([bt[i, torch.arange(p, p + q) // block_size].long() * block_size
                       + torch.arange(p, p + q) % block_size
                       for i, (p, q) in enumerate(zip(prefixes, q_lens))])
    key, value = _chunk_kv(sum(q_lens), num_kv_heads, head_dim, torch.float32, seed=8)
    unrounded = key.clone(), value.clone()
    tri.write_kv_triton(key, value, k_cache, v_cache, slots, k_scales=ks, v_scales=vs,
                        round_rows=True)
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(sum(q_lens), num_kv_heads * 4, head_dim, generator=gen)
    args = (query, k_cache, v_cache, bt, cu, seq_lens, 0.2)
    scales = {"k_scales": ks, "v_scales": vs}
    cached = tri.paged_attention_extend_triton(*args, **scales)
    assert_close(tri.paged_attention_extend_triton(*args, key=key, value=value, **scales),
                 cached)
    off = tri.paged_attention_extend_triton(*args, key=unrounded[0], value=unrounded[1],
                                            **scales)
    assert (off - cached).abs().max() > 1e-3


def test_extend_fp8_chunk_rows_ignored_under_a_sliding_window():
    """With a window the kernel keeps reading every key from the cache (FRESH_CHUNK_KV is for
    full attention), whatever rows are passed; bad rows are refused by name."""
    num_kv_heads, head_dim, block_size = 2, 32, 8
    k_cache, v_cache, ks, vs, bt, seq_lens = fp8_paged_kv([9, 30], num_kv_heads, head_dim,
                                                          block_size, seed=4)
    cu = torch.tensor([0, 5, 25], dtype=torch.int32)
    query = torch.randn(25, num_kv_heads * 2, head_dim)
    key, value = _chunk_kv(25, num_kv_heads, head_dim, torch.float32, seed=5)
    args = (query, k_cache, v_cache, bt, cu, seq_lens, 0.2)
    plain = tri.paged_attention_extend_triton(*args, sliding_window=7, k_scales=ks, v_scales=vs)
    with_rows = tri.paged_attention_extend_triton(*args, sliding_window=7, k_scales=ks,
                                                  v_scales=vs, key=key, value=value)
    torch.testing.assert_close(with_rows, plain, rtol=0, atol=0)
    with pytest.raises(ValueError, match="key is .*it must be"):
        tri.paged_attention_extend_triton(*args, k_scales=ks, v_scales=vs, key=key[:3],
                                          value=value[:3])
    with pytest.raises(ValueError, match="key and value together"):
        tri.paged_attention_extend_triton(*args, k_scales=ks, v_scales=vs, key=key)


@pytest.mark.parametrize("group, block_size", [(1, 8), (4, 16), (8, 32)])
def test_extend_fp8_products_within_e4m3_rounding(group, block_size, monkeypatch):
    """PAGEDRT_FP8_PREFILL_MMA=1 (opt-in, untimed): the extend kernel rounds each query row
    and the probabilities to e4m3 and multiplies the fp8 tiles as loaded. Against the
    reference: an error of e4m3's rounding (3 mantissa bits, up to 2^-4 relative per value;
    about 5% rms of the output here, measured), far from the exact path's 1e-5, and far below
    what a lost scale would give; with K/V of spread magnitudes finite everywhere."""
    num_kv_heads, head_dim = 2, 32
    lens, q_lens = [1, 16, 17, 40, 65], [1, 5, 17, 3, 40]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim)
    scale = head_dim ** -0.5
    monkeypatch.setenv("PAGEDRT_FP8_PREFILL_MMA", "1")
    for spread in (False, True):
        k, v, ks, vs, bt, seq_lens = fp8_paged_kv(lens, num_kv_heads, head_dim, block_size,
                                                  seed=group, spread=spread)
        expected = ref.paged_attention_extend_reference(query, k, v, bt, cu, seq_lens, scale,
                                                        k_scales=ks, v_scales=vs)
        out = tri.paged_attention_extend_triton(query, k, v, bt, cu, seq_lens, scale,
                                                k_scales=ks, v_scales=vs)
        assert torch.isfinite(out).all()
        if not spread:
            rms = ((out - expected).pow(2).mean() / expected.pow(2).mean()).sqrt().item()
            assert 1e-4 < rms < 0.08, rms


def _empty_fp8_cache(num_blocks, block_size, num_kv_heads, head_dim):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, NAN_BYTE, dtype=torch.uint8).view(FP8_DTYPE) for _ in range(2)]
    caches[1] = to_v_dim_major(caches[1])  # (K's layout: test_v_layouts_give_the_same_...)
    scales = [torch.full((num_blocks, num_kv_heads, block_size), float("nan")) for _ in range(2)]
    return caches + scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [8, 32])
def test_write_kv_fp8_is_the_references_bytes(dtype, block_size):
    """The writer's bytes and scales are the reference's; with round_rows the written rows
    (not the padding ones) are left holding the cache's values in their dtype, as the
    reference leaves them (fp32 exactly; bf16 within the interpreter's truncating cast)."""
    torch.manual_seed(block_size)
    num_blocks, num_kv_heads, head_dim, num_tokens = 6, 3, 16, 9  # 3 heads: a padded head row
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[2, 5]] = -1  # padding tokens
    magnitude = torch.exp2(torch.randint(-8, 8, (num_tokens, num_kv_heads, 1)).float())
    key = (torch.randn(num_tokens, num_kv_heads, head_dim) * magnitude).to(dtype)
    value = (torch.randn(num_tokens, num_kv_heads, head_dim) / magnitude).to(dtype)
    key[0, 1] = 0.0  # an all-zero head
    actual = _empty_fp8_cache(num_blocks, block_size, num_kv_heads, head_dim)
    expected = [t.clone() for t in actual]
    ref.write_kv_reference(key, value, *expected[:2], slots, *expected[2:])
    tri.write_kv_triton(key, value, *actual[:2], slots, k_scales=actual[2],
                        v_scales=actual[3])
    for got, want in zip(actual, expected):
        assert torch.equal(got.view(torch.uint8) if got.dtype == FP8_DTYPE else got.isnan(),
                           want.view(torch.uint8) if want.dtype == FP8_DTYPE else want.isnan())
        assert torch.equal(got.float().nan_to_num(), want.float().nan_to_num())
    written = actual[2].isfinite().sum().item()
    assert written == (num_tokens - 2) * num_kv_heads, "one scale per real token and head"
    rows = [key.clone(), value.clone()]
    ref_rows = [key.clone(), value.clone()]
    caches = _empty_fp8_cache(num_blocks, block_size, num_kv_heads, head_dim)
    ref.write_kv_reference(*ref_rows, *expected[:2], slots, *expected[2:], round_rows=True)
    tri.write_kv_triton(*rows, *caches[:2], slots, k_scales=caches[2], v_scales=caches[3],
                        round_rows=True)
    k32, v32 = dequantized_caches(*caches)
    real = slots >= 0
    blocks, offsets = slots[real] // block_size, slots[real] % block_size
    for got, want, orig, held in zip(rows, ref_rows, (key, value), (k32, v32)):
        assert torch.equal(got[~real], orig[~real]), "a padding row was touched"
        assert not torch.equal(got[real], orig[real]), "the rows were not rounded"
        if dtype == torch.float32:
            assert torch.equal(got, want)
            assert torch.equal(got[real], held[blocks, offsets])
        else:
            torch.testing.assert_close(got, want, rtol=2**-7, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim, num_heads, num_kv_heads", [(16, 4, 4), (64, 14, 2),
                                                               (16, 9, 3)])
def test_rotary_write_kv_fp8_is_rotary_then_reference_write(dtype, head_dim, num_heads,
                                                            num_kv_heads):
    """The fused RoPE + write kernel quantizes the key as rotated and rounded to its dtype,
    giving the bytes and scales of `write_kv_reference` after the torch rotation."""
    torch.manual_seed(head_dim + num_heads)
    num_tokens, block_size, num_blocks = 7, 4, 6
    rope = layers.RotaryEmbedding(head_dim, 512, base=10000.0)
    q = torch.randn(num_tokens, num_heads, head_dim).to(dtype)
    k = (torch.randn(num_tokens, num_kv_heads, head_dim) * 5).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    positions = torch.randint(0, 512, (num_tokens,))
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[3] = -1
    actual = _empty_fp8_cache(num_blocks, block_size, num_kv_heads, head_dim)
    expected = [t.clone() for t in actual]
    _, rotated_k = rope(positions, q.clone(), k.clone())
    ref.write_kv_reference(rotated_k, v, *expected[:2], slots, *expected[2:])
    rotary_write_kv_triton(positions, q, k, v, rope.cos_sin_cache, *actual[:2], slots,
                           k_scales=actual[2], v_scales=actual[3])
    if dtype == torch.float32:  # bit-exact
        for got, want in zip(actual, expected):
            assert torch.equal(got.float().nan_to_num(), want.float().nan_to_num())
    # bf16: the interpreter's truncating fp32 -> bf16 cast (see test_fused_triton.py) can leave
    # a rotated key one bf16 ulp off torch's; where that crosses an e4m3 rounding midpoint the
    # byte moves by one code (at most 2^-3 relative). V is not rotated: always exact.
    k_got, v_got = dequantized_caches(*actual)
    k_want, v_want = dequantized_caches(*expected)
    torch.testing.assert_close(k_got.nan_to_num(), k_want.nan_to_num(), rtol=2**-3, atol=1e-6)
    same = (actual[0].view(torch.uint8) == expected[0].view(torch.uint8)).float().mean()
    assert same > 0.95, f"only {same:.1%} of the key bytes are the reference's"
    torch.testing.assert_close(v_got.nan_to_num(), v_want.nan_to_num(), rtol=0, atol=0)
    # round_rows: the rotated key and the value rows as their cache slots now hold them
    k_rows, v_rows = k.clone(), v.clone()
    caches = _empty_fp8_cache(num_blocks, block_size, num_kv_heads, head_dim)
    rotary_write_kv_triton(positions, q.clone(), k_rows, v_rows, rope.cos_sin_cache,
                           *caches[:2], slots, k_scales=caches[2], v_scales=caches[3],
                           round_rows=True)
    k_held, v_held = dequantized_caches(*caches)
    real = slots >= 0
    blocks, offsets = slots[real] // block_size, slots[real] % block_size
    tol = {"rtol": 0, "atol": 0} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 0}
    torch.testing.assert_close(k_rows[real], k_held[blocks, offsets].to(dtype), **tol)
    torch.testing.assert_close(v_rows[real], v_held[blocks, offsets].to(dtype), **tol)
    assert torch.equal(v_rows[~real], v[~real])


def test_attention_layer_fused_rope_and_fp8_write(monkeypatch):
    """LlamaAttention with the fused kernels forced on (Triton attention, interpreter) over an
    FP8 cache: the fused RoPE + quantizing write runs once and the layer gives the torch path's
    output and cache."""
    from tiny_model import TINY_CONFIG

    from pagedrt.models.llama import LlamaAttention
    from pagedrt.ops.attention import AttentionMetadata, KVCacheLayer

    torch.manual_seed(5)
    attn = LlamaAttention(TINY_CONFIG)
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(torch.randn(param.shape) * 0.2)
    caches = KVCacheLayer(*_empty_fp8_cache(8, 4, TINY_CONFIG.num_key_value_heads,
                                            TINY_CONFIG.head_dim))
    ref_caches = KVCacheLayer(*[t.clone() for t in caches])
    x = torch.randn(6, TINY_CONFIG.hidden_size)
    positions = torch.tensor([0, 1, 2, 0, 1, 0])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([8, 9, 10, 20, 21, -1]),
        block_tables=torch.tensor([[2, 0], [5, 0]], dtype=torch.int32),
        seq_lens=torch.tensor([3, 2], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32),
        max_query_len=3, max_seq_len=3, backend="torch")
    with torch.no_grad():
        expected = attn(positions, x, ref_caches, meta)
        calls = []
        monkeypatch.setattr(layers, "_use_fused", lambda t: True)
        fused_kernel = layers._fused().rotary_write_kv_triton
        monkeypatch.setattr(layers._fused(), "rotary_write_kv_triton",
                            lambda *a, **kw: calls.append(1) or fused_kernel(*a, **kw))
        meta.backend = "triton"
        actual = attn(positions, x, caches, meta)
    assert calls == [1], "the fused RoPE + K/V write kernel did not run once"
    torch.testing.assert_close(actual[:5], expected[:5], rtol=1e-4, atol=1e-5)
    k_got, v_got = dequantized_caches(*caches)
    k_want, v_want = dequantized_caches(*ref_caches)
    torch.testing.assert_close(k_got.nan_to_num(), k_want.nan_to_num(), rtol=2**-3, atol=1e-6)
    torch.testing.assert_close(v_got.nan_to_num(), v_want.nan_to_num(), rtol=0, atol=0)
    assert caches.k_scales.isfinite().sum() == 5 * TINY_CONFIG.num_key_value_heads


@pytest.mark.parametrize("seq_lens, q_lens", [([9, 20], [1, 1]), ([13, 21], [5, 8])],
                         ids=["decode", "extend"])
def test_dispatcher_fp8_triton_equals_torch(seq_lens, q_lens):
    """paged_attention() (the model's path) over an FP8 cache: the Triton backend writes the
    torch backend's bytes and scales and attends like it, decode and prefill."""
    num_kv_heads, head_dim, block_size = 2, 16, 8
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens_t = fp8_paged_kv(
        seq_lens, num_kv_heads, head_dim, block_size, seed=sum(q_lens))
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
    key, value = torch.randn(num_tokens, 2, head_dim) * 3, torch.randn(num_tokens, 2, head_dim)
    caches = [k_cache, v_cache, k_scales, v_scales]
    ref_caches = [t.clone() for t in caches]
    out = attention.paged_attention(query, key, value, caches[0], caches[1], meta, 0.25,
                                    k_scales=caches[2], v_scales=caches[3])
    meta.backend = "torch"
    expected = attention.paged_attention(query, key, value, ref_caches[0], ref_caches[1], meta,
                                         0.25, k_scales=ref_caches[2], v_scales=ref_caches[3])
    assert_close(out, expected)
    for got, want in zip(caches, ref_caches):
        assert torch.equal(got.float().nan_to_num(), want.float().nan_to_num())


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_copy_blocks_moves_fp8_bytes_and_scales(backend):
    k_cache, v_cache, k_scales, v_scales, _, _ = fp8_paged_kv([20, 9], 2, 16, 8, spare_blocks=3)
    before = [t.clone() for t in (k_cache, v_cache, k_scales, v_scales)]
    mapping = torch.tensor([[0, 3], [5, 1]], dtype=torch.int64)
    as_bytes = [t.view(torch.uint8) for t in (k_cache, v_cache)]
    attention.copy_blocks(as_bytes[:1], as_bytes[1:], mapping, backend)
    attention.copy_blocks([k_scales], [v_scales], mapping, backend)
    for got, old in zip((k_cache, v_cache, k_scales, v_scales), before):
        got, old = got.view(torch.uint8) if got.dtype == FP8_DTYPE else got, \
            old.view(torch.uint8) if old.dtype == FP8_DTYPE else old
        for src, dst in mapping.tolist():
            assert torch.equal(got[dst].nan_to_num() if got.is_floating_point() else got[dst],
                               old[src].nan_to_num() if old.is_floating_point() else old[src])
        untouched = [b for b in range(got.shape[0]) if b not in (3, 1)]
        assert torch.equal(got[untouched].float().nan_to_num(), old[untouched].float().nan_to_num())


def test_fp8_contract_errors():
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv([5], 1, 16, 8)
    query = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match="needs k_scales"):
        tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 1.0)
    with pytest.raises(ValueError, match=r"k_scales shape .*expected \(4, 1, 8\)"):
        tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 1.0,
                                          k_scales=k_scales[:, :, :4], v_scales=v_scales)
    with pytest.raises(ValueError, match="k_scales.dtype"):
        tri.paged_attention_extend_triton(query, k_cache, v_cache, bt,
                                          torch.tensor([0, 1], dtype=torch.int32), seq_lens, 1.0,
                                          k_scales=k_scales.half(), v_scales=v_scales)
    plain = torch.zeros(4, 8, 1, 16)
    with pytest.raises(ValueError, match="pass None"):
        tri.write_kv_triton(torch.randn(1, 1, 16), torch.randn(1, 1, 16), plain, plain.clone(),
                            torch.tensor([0]), k_scales=k_scales, v_scales=v_scales)
    with pytest.raises(ValueError, match="naive decode kernel"):
        tri.paged_attention_decode_naive_triton(query, k_cache, v_cache, bt, seq_lens, 1.0)
