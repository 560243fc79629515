"""The split-K reduce folded into the decode kernel (PAGEDRT_DECODE_FUSED_REDUCE=1) on a CUDA
GPU: compiled, with the programs of a launch running at the same time on many SMs, so that the
arrival counters, the barrier, the acq_rel atomic and the L1-bypassing loads
(pagedrt/ops/attention_triton.py, module doc, "Fused reduce") meet real concurrency, which the
CPU tests (tests/test_decode_fused_reduce.py, one program at a time) cannot give them.

The fused path must give what the two-kernel path gives, at Llama-3-8B's heads (32 / 8 x 128)
and Qwen2-0.5B's (14 / 2 x 64), batch 1 and 8, contexts 512 and 4096, 4, 8 and 16 splits (16
splits of 512 tokens leave partitions empty), bf16 and FP8 caches: over many launches in a row
with no synchronization between them, and in a CUDA graph replayed several times, with every
counter back at 0 afterwards. The launches cycle through QUERIES different queries, so that a
program that read a partial before it was stored would read a stale one of another query (the
caching allocator hands the previous launch's partial buffers back) and change the output.
Run on the H200: python3 -m pytest -m gpu tests/gpu/test_decode_fused_reduce_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri
from pagedrt.ops.fp8 import FP8_DTYPE
from pagedrt.ops.triton_utils import to_v_dim_major

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
ENV = "PAGEDRT_DECODE_FUSED_REDUCE"
HEADS = {"llama3-8b": (32, 8, 128), "qwen2-0.5b": (14, 2, 64)}  # heads, KV heads, head_dim
BLOCK_SIZE = 16
LAUNCHES = 50  # fused launches in a row per case
REPLAYS = 12  # graph replays
QUERIES = 3  # launches and replays cycle through this many queries


def make_case(model: str, batch: int, ctx: int, kv_dtype: str, seed: int = 0):
    """Paged caches on the GPU with each sequence's K/V in shuffled blocks and NaN everywhere
    else (bf16 NaN; FP8: the NaN byte 0x7F and NaN scales, V dim-major as the engine stores it);
    sequence lengths ctx, ctx - 37, ctx - 74, ... (partitions of differing lengths).

    Returns (queries: QUERIES tensors [batch, heads, head_dim] bf16, args: the decode call's
    arguments after the query, kwargs: its FP8 scales or nothing)."""
    num_heads, num_kv_heads, head_dim = HEADS[model]
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    lens = [max(1, ctx - 37 * i) for i in range(batch)]
    blocks = [-(-n // BLOCK_SIZE) for n in lens]
    num_blocks = sum(blocks) + 1
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    kwargs = {}
    if kv_dtype == "fp8":
        k_cache, v_cache = (torch.full(shape, 0x7F, dtype=torch.uint8, device=CUDA)
                            .view(FP8_DTYPE) for _ in range(2))
        v_cache = to_v_dim_major(v_cache)
        kwargs = {name: torch.full((num_blocks, num_kv_heads, BLOCK_SIZE), float("nan"),
                                   device=CUDA) for name in ("k_scales", "v_scales")}
    else:
        k_cache, v_cache = (torch.full(shape, float("nan"), dtype=torch.bfloat16, device=CUDA)
                            for _ in range(2))
    perm = torch.randperm(num_blocks, device=CUDA, generator=gen)
    tables = torch.full((batch, max(blocks)), int(perm[-1]), dtype=torch.int32, device=CUDA)
    used = 0
    slots = []
    for i, (n, nb) in enumerate(zip(lens, blocks)):
        ids = perm[used:used + nb]
        used += nb
        tables[i, :nb] = ids.int()
        slots.append((ids[:, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE, device=CUDA))
                     .flatten()[:n])
    slots = torch.cat(slots)
    key, value = (torch.randn(slots.numel(), num_kv_heads, head_dim, device=CUDA, generator=gen)
                  .bfloat16() for _ in range(2))
    ref.write_kv_reference(key, value, k_cache, v_cache, slots, kwargs.get("k_scales"),
                           kwargs.get("v_scales"))
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    queries = [torch.randn(batch, num_heads, head_dim, device=CUDA, generator=gen).bfloat16()
               for _ in range(QUERIES)]
    return queries, (k_cache, v_cache, tables, seq_lens, head_dim ** -0.5), kwargs


def decode(monkeypatch, fused: bool, query, args, kwargs, num_splits: int) -> torch.Tensor:
    """Both ways on `_decode_kernel` at its default launch for the cache's dtype (an FP8
    cache's default is the warp-tile kernel, which has no fused reduce), so that the two
    differ only in the reduce."""
    monkeypatch.setenv(ENV, "1" if fused else "0")
    config = tri._decode_launch_config(query.shape[-1], args[0].element_size(),
                                       warp_tiles=False)
    return tri.paged_attention_decode_triton(query, *args, num_splits=num_splits,
                                             config=config, **kwargs)


def assert_counters_zero():
    torch.cuda.synchronize()
    counters = tri._REDUCE_COUNTERS[torch.device("cuda", torch.cuda.current_device())]
    assert int(counters.count_nonzero()) == 0, "a counter was left non-zero"


def assert_same_as_unfused(outs: list, unfused: list):
    """outs[i] (query i % QUERIES) against the two-kernel output: within one bf16 rounding
    (the two kernels may sum the weighted partials in another order), and bit for bit the
    same as every other fused output of that query (the combine's order is fixed, whichever
    program combines)."""
    for i, out in enumerate(outs):
        want = unfused[i % QUERIES]
        assert torch.isfinite(out).all(), f"launch {i}: NaN or inf"
        torch.testing.assert_close(out, want, rtol=2 ** -7, atol=1e-5,
                                   msg=lambda m, i=i: f"launch {i}: {m}")
        assert torch.equal(out, outs[i % QUERIES]), f"launch {i} differs from launch {i % QUERIES}"


def unfused_outputs(monkeypatch, queries, args, kwargs, num_splits):
    """The two-kernel outputs of each query, checked against the torch reference."""
    outs = [decode(monkeypatch, False, q, args, kwargs, num_splits) for q in queries]
    k_cache, v_cache, tables, seq_lens, scale = args
    for q, out in zip(queries, outs):
        want = ref.paged_attention_decode_reference(q.float(), k_cache, v_cache, tables,
                                                    seq_lens, scale, **kwargs)
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        assert err < 2e-2, f"the unfused path is off the reference by {err}"
    return outs


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("num_splits", [4, 8, 16])
@pytest.mark.parametrize("ctx", [512, 4096])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("model", list(HEADS))
def test_fused_reduce_matches_unfused_on_gpu(monkeypatch, model, batch, ctx, num_splits,
                                             kv_dtype):
    queries, args, kwargs = make_case(model, batch, ctx, kv_dtype, seed=batch + ctx + num_splits)
    unfused = unfused_outputs(monkeypatch, queries, args, kwargs, num_splits)
    outs = [decode(monkeypatch, True, queries[i % QUERIES], args, kwargs, num_splits)
            for i in range(LAUNCHES)]  # back to back, no synchronization
    assert_counters_zero()
    assert_same_as_unfused(outs, unfused)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("model", list(HEADS))
def test_fused_reduce_in_a_cuda_graph(monkeypatch, model, kv_dtype):
    """Two fused launches captured in one graph (as two layers would be: the same counters,
    one launch after the other) and the graph replayed REPLAYS times, the queries changed in
    place between replays; the counters exist before the capture (the eager warm-up)."""
    num_splits = 8
    queries, args, kwargs = make_case(model, 8, 4096, kv_dtype, seed=7)
    unfused = unfused_outputs(monkeypatch, queries, args, kwargs, num_splits)
    static = [queries[0].clone(), queries[1].clone()]
    for q in static:  # warm-up outside the capture: compiles, allocates the counters
        decode(monkeypatch, True, q, args, kwargs, num_splits)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outs = [decode(monkeypatch, True, q, args, kwargs, num_splits) for q in static]
    outs = [[], []]
    for i in range(REPLAYS):
        static[0].copy_(queries[i % QUERIES])
        static[1].copy_(queries[(i + 1) % QUERIES])
        graph.replay()
        outs[0].append(static_outs[0].clone())
        outs[1].append(static_outs[1].clone())
    assert_counters_zero()
    assert_same_as_unfused(outs[0], unfused)
    assert_same_as_unfused(outs[1], unfused[1:] + unfused[:1])


def test_capture_needing_more_counters_raises(monkeypatch):
    """A launch captured in a CUDA graph that needs more counters than exist (8 sequences x 2
    KV heads against 8 here) raises RuntimeError and allocates none; the eager launch before
    it compiled the kernel and used the real counters."""
    queries, args, kwargs = make_case("qwen2-0.5b", 8, 512, "bf16", seed=3)
    decode(monkeypatch, True, queries[0], args, kwargs, 4)
    torch.cuda.synchronize()
    device = torch.device("cuda", torch.cuda.current_device())
    small = torch.zeros(8, dtype=torch.int32, device=CUDA)
    monkeypatch.setattr(tri, "_REDUCE_COUNTERS", {device: small})
    graph = torch.cuda.CUDAGraph()
    with (pytest.raises(RuntimeError, match="needs 16 arrival counters .* 8 exist"),
          torch.cuda.graph(graph)):
        decode(monkeypatch, True, queries[0], args, kwargs, 4)
    assert tri._REDUCE_COUNTERS[device] is small
