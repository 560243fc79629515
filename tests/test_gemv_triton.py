"""The skinny matmul kernel (pagedrt/ops/gemv_triton.py) against torch, under the Triton
interpreter on CPU: every row count it serves, every tile config, ragged N and K, bias."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

from pagedrt.ops.gemv_triton import (
    CONFIGS,
    MAX_ROWS,
    WIDE_K_CONFIGS,
    candidate_configs,
    gemv_triton,
    linear,
)

ALL_CONFIGS = CONFIGS + WIDE_K_CONFIGS


@pytest.mark.parametrize("config", ALL_CONFIGS,
                         ids=[f"n{c[0]}k{c[1]}w{c[2]}" for c in ALL_CONFIGS])
@pytest.mark.parametrize("m", range(1, MAX_ROWS + 1))
def test_matches_torch(m, config):
    g = torch.Generator().manual_seed(m * 100 + config[0])
    n, k = 70, 300  # neither a multiple of any tile
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g)
    for bias in (None, b):
        got = gemv_triton(x, w, bias, config)
        want = torch.nn.functional.linear(x, w, bias)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_wide_k_tiles_are_timed_only_where_four_row_tiles_underfill_the_gpu():
    assert candidate_configs(896, 132) == CONFIGS + WIDE_K_CONFIGS  # 224 programs < 264
    assert candidate_configs(1152, 132) == CONFIGS  # 288 programs
    assert candidate_configs(1152, 200) == CONFIGS + WIDE_K_CONFIGS


@pytest.mark.parametrize("prologue", ["rmsnorm", "silu_mul"])
@pytest.mark.parametrize("config", WIDE_K_CONFIGS)
@pytest.mark.parametrize("m", [1, 3])
def test_wide_k_tiles_with_prologues_and_a_long_row(m, config, prologue):
    """K = 4,864 (Qwen2-0.5B's down projection): the pre-wait columns (PRE_K: 2,048 or 4,096)
    cover part of the row, the loop the rest in full and masked (the last) steps."""
    from pagedrt.ops.gemv_triton import gemv_rmsnorm_triton, gemv_silu_mul_triton

    g = torch.Generator().manual_seed(m + config[0])
    n, k = 5, 4864
    w = torch.randn(n, k, generator=g)
    if prologue == "silu_mul":
        x = torch.randn(m, 2 * k, generator=g)
        got = gemv_silu_mul_triton(x, w, None, config)
        gate, up = x[:, :k], x[:, k:]
        want = (torch.nn.functional.silu(gate) * up) @ w.T
    else:
        x, res = torch.randn(m, k, generator=g), torch.randn(m, k, generator=g)
        norm_w = torch.randn(k, generator=g)
        got, new_res = gemv_rmsnorm_triton(x, res, norm_w, 1e-6, w, None, config)
        h = x + res
        torch.testing.assert_close(new_res, h)
        want = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w) @ w.T
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_half_precision_and_strided_rows():
    g = torch.Generator().manual_seed(7)
    big = torch.randn(3, 2 * 256, generator=g).to(torch.bfloat16)
    x = big[:, :256]  # row stride 512: rows of a larger buffer
    w = torch.randn(40, 256, generator=g).to(torch.bfloat16)
    got = gemv_triton(x, w, None, (8, 128, 4)).float()
    want = x.float() @ w.float().T
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_bad_inputs_and_cpu_dispatch():
    x, w = torch.randn(5, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="5 rows"):
        gemv_triton(x, w)
    with pytest.raises(ValueError, match="do not multiply"):
        gemv_triton(x[:2], torch.randn(4, 9))
    with pytest.raises(ValueError, match="must match"):
        gemv_triton(x[:2], w.double())
    # off CUDA `linear` is plain F.linear
    torch.testing.assert_close(linear(x[:2], w), x[:2] @ w.T)
