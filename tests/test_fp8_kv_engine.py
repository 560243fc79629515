"""The FP8 KV cache through the engine (tiny random-weight Llama, CPU): configuration and bad
input, sizing, stats and /metrics, block moves (copy-on-write, swap) carrying scales with their
blocks, prefix caching, and the Triton kernels (interpreter) against the torch path."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere (Triton backend test)

import random

import pytest
import torch

from pagedrt import LLM, EngineConfig, SamplingParams
from pagedrt.entrypoints.metrics import ServerMetrics
from pagedrt.kv.kv_cache import KVCache, KVCacheSpec, resolve_kv_cache_dtype
from pagedrt.kv.kv_cache_manager import PendingCopies
from pagedrt.ops.fp8 import FP8_DTYPE

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def _prompts(n: int = 6, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(384) for _ in range(rng.randint(5, 40))] for _ in range(n)]


def _tokens(outs) -> list[list[int]]:
    return [list(c.token_ids) for o in outs for c in o.outputs]


# ------------------------------------------------------------------ configuration and bad input
@pytest.mark.parametrize("value", ["int8", "fp16", "FP8", ""])
def test_unknown_kv_cache_dtype_is_refused(value):
    with pytest.raises(ValueError, match=rf"kv_cache_dtype='{value}'.*'auto'.*'fp8'"):
        EngineConfig(kv_cache_dtype=value)
    with pytest.raises(ValueError, match=rf"kv_cache_dtype='{value}'.*'auto'.*'fp8'"):
        resolve_kv_cache_dtype(value, torch.float32, torch.device("cpu"), "torch")


def test_fp8_on_a_gpu_without_fp8_is_refused(monkeypatch):
    """The Triton kernels need compute capability 8.9 (e4m3 conversions); an A100 (8.0) gets
    a ValueError naming the GPU, its capability and what is supported. The torch backend
    does not ask."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    cuda = torch.device("cuda")
    for backend in ("triton", "auto"):
        with pytest.raises(ValueError, match=r"A100 is 8\.0.*'auto'.*attention_backend='torch'"):
            resolve_kv_cache_dtype("fp8", torch.bfloat16, cuda, backend)
    assert resolve_kv_cache_dtype("fp8", torch.bfloat16, cuda, "torch") == FP8_DTYPE
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_kv_cache_dtype("fp8", torch.bfloat16, cuda, "triton") == FP8_DTYPE
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, cuda, "triton") == torch.bfloat16


def test_llm_refuses_an_unknown_kv_cache_dtype(tiny):
    """(The command line's --kv-cache-dtype: tests/test_cli.py, like every engine option.)"""
    with pytest.raises(ValueError, match="kv_cache_dtype='e5m2'"):
        LLM(tiny, kv_cache_dtype="e5m2")


# ------------------------------------------------------------------ sizing, stats, /metrics
def test_fp8_spec_counts_its_bytes():
    """Llama-3-8B's cache (32 layers, 8 KV heads x 128): 131,072 bytes per token in bf16;
    in fp8 one byte per element plus a 4-byte scale per token, head, K and V."""
    bf16 = KVCacheSpec(32, 8, 128, 16, torch.bfloat16)
    fp8 = KVCacheSpec(32, 8, 128, 16, FP8_DTYPE)
    assert bf16.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert fp8.bytes_per_token == 2 * 32 * 8 * (128 + 4) == 67_584
    assert fp8.bytes_per_block == 16 * 67_584
    assert (fp8.dtype_name, bf16.dtype_name) == ("fp8_e4m3", "bfloat16")
    assert 1.93 < bf16.bytes_per_block / fp8.bytes_per_block < 1.94  # ~twice the blocks


def test_fp8_cache_fits_more_blocks_and_says_so(tiny):
    """Same byte budget: blocks = budget // bytes per block. The tiny model (fp32, 2 layers,
    2 KV heads x 16) holds 512 bytes per token in fp32, 2 * 2 * 2 * (16 + 4) = 160 in fp8."""
    budget = 1 << 20
    stats = {}
    for kv_dtype in ("auto", "fp8"):
        llm = LLM(tiny, kv_cache_dtype=kv_dtype, kv_cache_memory_bytes=budget, block_size=8)
        stats[kv_dtype] = llm.stats()
        cache = llm.llm_engine.kv_cache
        assert cache.k_caches[0].dtype == (FP8_DTYPE if kv_dtype == "fp8" else torch.float32)
        assert len(cache.k_scales) == (2 if kv_dtype == "fp8" else 0)
    assert stats["auto"]["kv_cache_dtype"] == "float32"
    assert stats["fp8"]["kv_cache_dtype"] == "fp8_e4m3"
    assert stats["auto"]["kv_cache_bytes_per_token"] == 512
    assert stats["fp8"]["kv_cache_bytes_per_token"] == 160
    assert stats["auto"]["num_blocks"] == budget // (8 * 512)
    assert stats["fp8"]["num_blocks"] == budget // (8 * 160)


def test_metrics_say_which_dtype_the_cache_holds():
    metrics = ServerMetrics()
    metrics.bind(lambda: {"kv_cache_dtype": "fp8_e4m3", "block_size": 16,
                          "kv_cache_bytes_per_token": 67584})
    text = metrics.render().decode()
    assert 'pagedrt_kv_cache_info{block_size="16",kv_cache_dtype="fp8_e4m3"} 1.0' in text
    assert "pagedrt_kv_cache_bytes_per_token 67584.0" in text


def test_v_is_dim_major_unless_windowed_or_turned_off(monkeypatch):
    """An FP8 cache's V is dim-major by default; not for a model with sliding-window layers
    (its decode tiles start unaligned); PAGEDRT_FP8_V_DIM_MAJOR=0 or 1 decides over both."""
    import dataclasses

    from tiny_model import TINY_CONFIG

    windowed = dataclasses.replace(TINY_CONFIG, sliding_window=8)
    monkeypatch.delenv("PAGEDRT_FP8_V_DIM_MAJOR", raising=False)
    assert KVCacheSpec.for_model(TINY_CONFIG, 16, FP8_DTYPE).v_dim_major
    assert not KVCacheSpec.for_model(windowed, 16, FP8_DTYPE).v_dim_major
    assert not KVCacheSpec.for_model(TINY_CONFIG, 16, torch.bfloat16).v_dim_major
    assert KVCacheSpec(2, 2, 16, 8, FP8_DTYPE).v_dim_major
    for env, want in (("0", False), ("1", True)):
        monkeypatch.setenv("PAGEDRT_FP8_V_DIM_MAJOR", env)
        assert [KVCacheSpec.for_model(c, 16, FP8_DTYPE).v_dim_major
                for c in (TINY_CONFIG, windowed)] == [want, want]


# ------------------------------------------------------------------ block moves carry scales
@pytest.fixture(params=["v_like_k", "v_dim_major"])
def v_layout(request, monkeypatch):
    """Run a test with V in K's layout (PAGEDRT_FP8_V_DIM_MAJOR=0) and dim-major (the default
    without sliding windows; =1), read when each KVCacheSpec is made."""
    monkeypatch.setenv("PAGEDRT_FP8_V_DIM_MAJOR", "1" if request.param == "v_dim_major" else "0")
    return request.param


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_kv_cache_moves_scales_with_their_blocks(backend, v_layout):
    """Copy-on-write (either backend's copy) and swap out / in move each block's fp8 bytes
    and its scales, in every layer, and nothing else."""
    spec = KVCacheSpec(2, 2, 16, 8, FP8_DTYPE)
    cache = KVCache(spec, num_blocks=6, num_cpu_blocks=3, device=torch.device("cpu"),
                    backend=backend)
    assert spec.v_dim_major == (v_layout == "v_dim_major")
    assert cache.v_caches[0].stride(-1) == (1 if v_layout == "v_like_k" else 8)
    gen = torch.Generator().manual_seed(0)
    device_tensors = cache.k_caches + cache.v_caches + cache.k_scales + cache.v_scales
    for t in device_tensors:
        if t.dtype == FP8_DTYPE:
            t.view(torch.uint8).copy_(torch.randint(0, 0x7F, t.shape, generator=gen))
        else:
            t.copy_(torch.rand(t.shape, generator=gen))

    def snapshot():
        return [t.view(torch.uint8).clone() if t.dtype == FP8_DTYPE else t.clone()
                for t in device_tensors]

    before = snapshot()
    cache.apply(PendingCopies(copy=[(1, 4)]))
    after = snapshot()
    for old, new in zip(before, after):
        assert torch.equal(new[4], old[1])
        assert torch.equal(new[[0, 1, 2, 3, 5]], old[[0, 1, 2, 3, 5]])
    cache.apply(PendingCopies(swap_out=[(2, 0), (3, 2)]))
    for t in device_tensors:  # the device blocks are reused by someone else
        (t.view(torch.uint8) if t.dtype == FP8_DTYPE else t)[[2, 3]] = 0
    cache.apply(PendingCopies(swap_in=[(2, 5), (0, 3)]))
    final = snapshot()
    for old, new in zip(after, final):
        assert torch.equal(new[5], old[3]) and torch.equal(new[3], old[2])


def test_forks_copy_on_write_fp8_blocks(tiny, v_layout):
    """n = 3 greedy samples share the prompt's partial block until each writes into it
    (copy-on-write): every sample gives the tokens of a lone n = 1 run."""
    prompts = [p for p in _prompts(4, seed=1) if len(p) % 8][:2]
    llm = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=64, block_size=8)
    alone = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    forked = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16,
                                                  ignore_eos=True, n=3), use_tqdm=False)
    assert llm.stats()["num_cow_copies"] > 0
    for out, expected in zip(forked, alone):
        assert [list(c.token_ids) for c in out.outputs] == [expected] * 3
    llm.llm_engine.check_integrity()


def test_swapped_fp8_requests_resume_with_their_scales(tiny, v_layout):
    """Preemption by swap under a tight cache gives the tokens of a roomy run: the blocks'
    scales went to the CPU pool and back with them."""
    prompts = _prompts(10, seed=5)
    roomy = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=256, block_size=8)
    expected = _tokens(roomy.generate(prompts, GREEDY, use_tqdm=False))
    spec = KVCacheSpec.for_model(tiny.model_config, 8, FP8_DTYPE)
    tight = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=20, block_size=8,
                max_num_batched_tokens=64, preemption_mode="swap",
                swap_space_bytes=64 * spec.bytes_per_block)
    assert _tokens(tight.generate(prompts, GREEDY, use_tqdm=False)) == expected
    s = tight.stats()
    assert s["num_swapped_out_blocks"] == s["num_swapped_in_blocks"] > 0
    assert s["num_free_blocks"] + s["num_cached_blocks"] == s["num_blocks"]


def test_prefix_cache_hits_reuse_fp8_blocks(tiny, v_layout):
    """A second request with the same 24-token prefix reads the first one's cached fp8 blocks
    (and their scales): the same tokens as without prefix caching."""
    rng = random.Random(2)
    shared = [rng.randrange(384) for _ in range(24)]
    prompts = [shared + [rng.randrange(384) for _ in range(5)] for _ in range(3)]
    off = LLM(tiny, kv_cache_dtype="fp8", enable_prefix_caching=False, num_kv_blocks=64,
              block_size=8)
    expected = _tokens(off.generate(prompts, GREEDY, use_tqdm=False))
    on = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=64, block_size=8)
    got = [_tokens(on.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]
    assert got == expected
    assert on.stats()["prefix_cache_hits"] >= 2 * 24


# ------------------------------------------------------------------ the Triton kernels
def test_triton_fp8_engine_matches_torch_fp8_engine(tiny, v_layout):
    """The engine with the Triton kernels (interpreter: write, decode, extend) and an FP8
    cache samples the torch path's tokens, over a chunked prefill and mixed steps."""
    prompts = _prompts(2, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(tiny, kv_cache_dtype="fp8", attention_backend=backend, num_kv_blocks=64,
                  block_size=8, max_num_batched_tokens=32)
        outs[backend] = _tokens(llm.generate(prompts, params, use_tqdm=False))
    assert outs["triton"] == outs["torch"]



def test_tensor_parallel_ranks_hold_fp8_caches(tiny):
    """Two ranks (worker processes), each with an FP8 cache of its one KV head: the tokens of
    one rank's FP8 cache, and stats give the bytes of one rank's cache. Quantization is per KV
    head, so sharding the heads changes no scale; but the row-parallel matmuls sum in another
    order (and the CPU's BLAS may vary with memory alignment), and an ulp can carry a K or V
    value across an e4m3 rounding boundary, after which this tiny random model's close
    logits may send a sequence elsewhere (one clean-clone CI run in about five: the third
    prompt from its second token). So: every first token and at least two of the three
    answers identical."""
    prompts = _prompts(3, seed=11)
    one = LLM(tiny, kv_cache_dtype="fp8", num_kv_blocks=64, block_size=8)
    expected = _tokens(one.generate(prompts, GREEDY, use_tqdm=False))
    two = LLM(tiny, kv_cache_dtype="fp8", tensor_parallel_size=2, num_kv_blocks=64,
              block_size=8)
    try:
        got = _tokens(two.generate(prompts, GREEDY, use_tqdm=False))
        assert [g[0] for g in got] == [e[0] for e in expected]
        assert sum(g == e for g, e in zip(got, expected)) >= 2, (got, expected)
        stats = two.stats()
        assert stats["kv_cache_dtype"] == "fp8_e4m3"
        assert stats["kv_cache_bytes_per_token"] == 2 * 2 * 1 * (16 + 4)  # layers, K+V, 1 head
    finally:
        two.llm_engine.shutdown()


def test_bench_throughput_compares_kv_cache_dtypes(smollm2_path, tmp_path):
    """`pagedrt bench throughput --kv-cache-dtype fp8 --compare-kv-cache-dtype auto` runs the
    workload on both caches of the same weights (a short run on CPU): one row each, with the
    cache's dtype and blocks (the FP8 cache fits more in the same byte budget)."""
    import json

    from pagedrt.bench.throughput import main

    assert main(["--model", smollm2_path, "--device", "cpu", "--dtype", "float32",
                 "--num-requests", "2", "--input-len", "8", "--output-len", "2",
                 "--kv-cache-dtype", "fp8", "--compare-kv-cache-dtype", "auto",
                 "--kv-cache-memory-bytes", str(64 << 20), "--skip-step-split",
                 "--warm-up-requests", "1", "--out", str(tmp_path), "--name", "t"]) == 0
    rows = json.loads((tmp_path / "t.json").read_text())["results"]
    fp8, full = rows
    assert (fp8["kv_cache_dtype"], full["kv_cache_dtype"]) == ("fp8_e4m3", "float32")
    assert fp8["output_tokens"] == full["output_tokens"] == 4
    assert fp8["kv_num_blocks"] > 3 * full["kv_num_blocks"]  # 1 + 4/64 bytes against 4
