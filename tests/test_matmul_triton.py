"""The tiled decode matmul (pagedrt/ops/matmul_triton.py) under the Triton interpreter on CPU:
both tile orientations against torch, its contract errors, its timed choice, and the decoder
layers' 8-128-row path end to end on the tiny model."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

from pagedrt.ops import matmul_triton
from pagedrt.ops.matmul_triton import matmul_triton as mm
from pagedrt.ops.matmul_triton import row_count_timed
from tests.decode_path import (
    assert_same_tokens,
    generate_8_and_16,
    mixed_sampling,
    prompts_and_params,
)
from tests.tiny_model import build_tiny_llama, perturb_norms

# small tiles keep the interpreter quick; both orientations, K tiles that do and do not divide K
CONFIGS = [(16, 32, 32, 4, 2, False), (16, 64, 64, 4, 3, True), (32, 16, 64, 4, 2, True)]
IDS = ["m16n32k32", "swap_m16n64k64", "swap_m32n16k64"]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 8, 19])
def test_matches_torch(m, dtype, config):
    g = torch.Generator().manual_seed(m * 7 + config[1])
    n = 70  # not a multiple of any tile
    for k in (128, 100):  # a multiple of every BLOCK_K, and not
        x = torch.randn(m, k, generator=g).to(dtype)
        w, b = torch.randn(n, k, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
        for bias in (None, b):
            got = mm(x, w, bias, config).float()
            want = torch.nn.functional.linear(x.float(), w.float(),
                                              None if bias is None else bias.float())
            tol = 1e-4 if dtype == torch.float32 else 2e-2  # fp16: the output's rounding
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("split_k", [2, 3, 8])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_split_k_matches_torch_and_leaves_counters_at_zero(split_k, swap_ab):
    """Split-K: K = 200 in BLOCK_K = 32 steps is 7 steps, so split 8 leaves one split empty
    and split 3 splits unevenly; bias added once; the same bits on a second call (the sum runs
    in split order whichever program is last); every arrival counter back at 0."""
    from pagedrt.ops.arrival_counters import _COUNTERS

    g = torch.Generator().manual_seed(split_k)
    config = (16, 32, 32, 4, 2, swap_ab, split_k)
    for m, dtype in ((8, torch.float32), (19, torch.float16)):
        x = torch.randn(m, 200, generator=g).to(dtype)
        w, b = torch.randn(70, 200, generator=g).to(dtype), torch.randn(70, generator=g).to(dtype)
        got = mm(x, w, b, config)
        want = torch.nn.functional.linear(x.double(), w.double(), b.double())
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
        assert torch.equal(mm(x, w, b, config), got)
    assert int(_COUNTERS[torch.device("cpu")].abs().sum()) == 0


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_mul_matches_the_plain_path(dtype, config):
    """silu_mul: the gate/up product with SwiGLU's activation in the epilogue equals the
    plain path's rounding chain (the product rounded, silu rounded, the product with up); an
    intermediate size no tile divides, K that BLOCK_K does and does not divide."""
    from pagedrt.ops.fused_triton import silu_and_mul_triton

    g = torch.Generator().manual_seed(config[0] + config[1])
    for m, k in ((8, 128), (19, 100)):
        x = torch.randn(m, k, generator=g).to(dtype)
        w = (torch.randn(2 * 70, k, generator=g) / k ** 0.5).to(dtype)
        got = mm(x, w, None, config, silu_mul=True)
        assert got.shape == (m, 70) and got.dtype == dtype
        plain = silu_and_mul_triton(torch.nn.functional.linear(x, w))
        tol = 1e-5 if dtype == torch.float32 else 2e-3  # fp16: where the products round
        torch.testing.assert_close(got, plain, rtol=tol, atol=tol)


@pytest.mark.parametrize("config", matmul_triton.CONFIGS, ids=str)
def test_every_candidate_the_timing_may_pick_matches_torch(config):
    """Each config of the engine's own CONFIGS (the narrow 16-row tiles, split-K among them)
    and, where whole-K, SILU_CONFIGS' epilogue: fp16 against torch at 8 and 19 rows, N = 70 (no
    tile divides it) and K = 320 (BLOCK_K 256 does not divide it, 64 and 128 do)."""
    from pagedrt.ops.fused_triton import silu_and_mul_triton

    g = torch.Generator().manual_seed(sum(config))
    for m in (8, 19):
        x = torch.randn(m, 320, generator=g).half()
        w = (torch.randn(70, 320, generator=g) / 320 ** 0.5).half()
        b = torch.randn(70, generator=g).half()
        want = torch.nn.functional.linear(x.float(), w.float(), b.float())
        torch.testing.assert_close(mm(x, w, b, config).float(), want, rtol=2e-2, atol=2e-2)
        if config in matmul_triton.SILU_CONFIGS:
            w2 = (torch.randn(2 * 70, 320, generator=g) / 320 ** 0.5).half()
            plain = silu_and_mul_triton(torch.nn.functional.linear(x, w2))
            torch.testing.assert_close(mm(x, w2, None, config, silu_mul=True), plain,
                                       rtol=2e-3, atol=2e-3)


def test_bf16_under_the_interpreter_is_multiplied_in_fp32():
    """The interpreter's bf16 tl.dot is wrong (triton 3.9): the kernel upcasts there, so bf16
    matches torch within the output's rounding."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 96, generator=g).bfloat16()
    w, b = torch.randn(40, 96, generator=g).bfloat16(), torch.randn(40, generator=g).bfloat16()
    for config in CONFIGS:
        want = torch.nn.functional.linear(x.float(), w.float(), b.float())
        torch.testing.assert_close(mm(x, w, b, config).float(), want, rtol=2e-2, atol=5e-2)


def test_zero_rows():
    assert mm(torch.randn(0, 32), torch.randn(8, 32)).shape == (0, 8)


def test_bad_inputs():
    x, w = torch.randn(8, 32), torch.randn(16, 32)
    with pytest.raises(ValueError, match="do not multiply"):
        mm(torch.randn(8, 33), w)
    with pytest.raises(ValueError, match="must match"):
        mm(x, w.double())
    with pytest.raises(ValueError, match="bias"):
        mm(x, w, torch.randn(15))
    with pytest.raises(ValueError, match="bias"):
        mm(x, w, torch.randn(32)[::2])  # strided
    with pytest.raises(ValueError, match="bias"):
        mm(x, w, torch.randn(16).double())
    with pytest.raises(ValueError, match="BLOCK_N = 24"):
        mm(x, w, None, (16, 24, 32, 4, 2, False))
    with pytest.raises(ValueError, match="contiguous"):
        mm(x, torch.randn(32, 16).T)
    with pytest.raises(ValueError, match="split_k = 0"):
        mm(x, w, None, (16, 32, 32, 4, 2, False, 0))
    with pytest.raises(ValueError, match="expected"):
        mm(x, w, None, (16, 32, 32, 4))
    with pytest.raises(ValueError, match="silu_mul"):
        mm(x, w, torch.randn(16), silu_mul=True)
    with pytest.raises(ValueError, match="silu_mul"):
        mm(x, w, None, (16, 32, 32, 4, 2, False, 2), silu_mul=True)
    with pytest.raises(ValueError, match="silu_mul"):
        mm(x, torch.randn(15, 32), None, silu_mul=True)


def test_row_counts_timed_are_the_decode_graph_buckets():
    from pagedrt.engine.cuda_graphs import graph_batch_sizes

    buckets = [b for b in graph_batch_sizes(256) if 5 <= b <= 128]
    assert [m for m in range(1, 400) if row_count_timed(m)] == buckets


def test_fused_ops_rows_up_to_fused_max_rows(monkeypatch):
    """PAGEDRT_MATMUL_FUSED_MAX_ROWS: the fused ops' timed row counts reach the decode graphs'
    buckets up to it (256: 144 ... 256), the plain projection's stay at 128; a bad value is a
    ValueError naming it; gate/up with SwiGLU's activation runs at 160 rows (10 row tiles of
    16)."""
    from pagedrt.engine.cuda_graphs import graph_batch_sizes
    from pagedrt.ops.fused_triton import silu_and_mul_triton
    from pagedrt.ops.matmul_triton import fused_max_rows

    assert fused_max_rows(None) == fused_max_rows(" ") == 128
    assert fused_max_rows("256") == 256 and fused_max_rows("192") == 192
    for bad in ("100", "512", "64", "two hundred", "-256"):
        with pytest.raises(ValueError, match=f"PAGEDRT_MATMUL_FUSED_MAX_ROWS={bad!r}"):
            fused_max_rows(bad)
    assert [m for m in range(1, 400) if row_count_timed(m, fused=True)] == \
        [m for m in range(1, 400) if row_count_timed(m)]  # the default: the same buckets
    monkeypatch.setattr(matmul_triton, "FUSED_MAX_ROWS", 256)
    assert [m for m in range(1, 400) if row_count_timed(m, fused=True)] == \
        [b for b in graph_batch_sizes(256) if b >= 8]
    assert not row_count_timed(144) and row_count_timed(144, fused=True)
    g = torch.Generator().manual_seed(160)
    x, w = torch.randn(160, 32, generator=g), torch.randn(2 * 24, 32, generator=g)
    act = mm(x, w, None, CONFIGS[0], silu_mul=True)
    torch.testing.assert_close(act, silu_and_mul_triton(torch.nn.functional.linear(x, w)),
                               rtol=1e-5, atol=1e-5)


def test_shapes_are_timed_only_inside_timing_and_outside_capture(monkeypatch):
    """An untimed shape takes cuBLAS (None) and stays untimed outside `timing()` (a running
    engine) and under graph capture; inside `timing()` its first call times it, and the choice
    then holds everywhere."""
    monkeypatch.setattr(matmul_triton, "_CHOICE", {})
    monkeypatch.setattr(matmul_triton, "fastest_config", lambda *a, **k: CONFIGS[1])
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    assert matmul_triton._choice(("k",), None, None) is None
    with matmul_triton.timing():
        capturing[0] = True
        assert matmul_triton._choice(("k",), None, None) is None
        assert matmul_triton._CHOICE == {}
        capturing[0] = False
        assert matmul_triton._choice(("k",), None, None) == CONFIGS[1]
    monkeypatch.setattr(matmul_triton, "fastest_config", lambda *a, **k: None)
    assert matmul_triton._choice(("k",), None, None) == CONFIGS[1]
    assert not matmul_triton._TIMING


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_batches_of_8_to_16_give_the_cublas_tokens(monkeypatch, sampling):
    """Greedy decoding of 8 and 16 requests with every 8-128-row matmul of the layers through
    the Triton kernel (the interpreter runs it; fp32, so exact products) gives the plain
    path's tokens and nearly its logprobs. The norms' weights are perturbed (the tiny model's
    are 1), so a norm applied in the wrong place shows; each variant runs in an engine of its
    own. `mixed`: a mixed batch of greedy and seeded sampling (top-k, top-p, min-p,
    penalties) instead of greedy only."""

    calls = []

    def always(key, baseline, candidate, configs=None):
        calls.append(key[0])
        if key[0] == "silu_mul":  # gate/up with the activation in its epilogue
            return (16, 32, 32, 4, 2, len(calls) % 2 == 0)
        if key[0] == "qkv_rope":  # the plain QKV projection and RoPE kernel here
            return None
        # both orientations, whole K and split in 3
        return (16, 32, 32, 4, 2, len(calls) % 2 == 0, 3 if len(calls) % 3 == 0 else 1)

    g = torch.Generator().manual_seed(9)
    model = perturb_norms(build_tiny_llama(seed=0), g)
    prompts, params = prompts_and_params(g)
    if sampling == "mixed":
        params = mixed_sampling(len(prompts))

    def generate(tiled, choice):
        return generate_8_and_16(monkeypatch, model, prompts, params, tiled, choice)

    plain = generate(False, always)
    assert not calls
    assert_same_tokens(generate(True, always), plain)
    assert calls and "silu_mul" in calls  # the layers took the path, gate/up's fused too


def test_layers_and_graph_runner_need_no_triton():
    """Triton is optional: with it unimportable the layers' linear (8-128 rows and 1-4 rows)
    is F.linear on CPU tensors, and the CUDA-graph runner's module imports."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["triton"] = None
import torch
from pagedrt.models import layers
import pagedrt.engine.cuda_graphs
w = torch.randn(4, 8)
for rows in (2, 16):
    x = torch.randn(rows, 8)
    assert torch.equal(layers._linear(x, w, None), torch.nn.functional.linear(x, w))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, cwd=root, env={**os.environ, "PYTHONPATH": root},
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
