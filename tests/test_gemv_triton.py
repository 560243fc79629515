"""The skinny matmul kernel (pagedrt/ops/gemv_triton.py) against torch, under the Triton
interpreter on CPU: every row count it serves, every tile config, ragged N and K, bias."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch.nn.functional as F

from pagedrt.ops.gemv_triton import (
    CONFIGS,
    MAX_ROWS,
    WIDE_K_CONFIGS,
    candidate_configs,
    gemv_triton,
    linear,
    row_configs,
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


def test_row_configs_only_at_one_row_and_where_registers_hold_them(monkeypatch):
    from pagedrt.ops import gemv_triton as gemv_triton_module

    assert row_configs(896, 1) == [(8, 1024, 4, 8), (4, 1024, 4, 8), (2, 1024, 4, 8)]
    assert row_configs(4864, 1) == [(2, 8192, 8, 8), (1, 8192, 8, 8)]  # 64 values a thread
    assert row_configs(14336, 1) == [(1, 16384, 8, 8)]
    assert row_configs(16385, 1) == [] and row_configs(896, 2) == []
    # timed only with PAGEDRT_GEMV_ROW=1 (opt-in)
    assert candidate_configs(896, 132, 896, 1) == CONFIGS + WIDE_K_CONFIGS
    monkeypatch.setattr(gemv_triton_module, "ROW_ENABLED", True)
    assert candidate_configs(896, 132, 896, 1) == CONFIGS + WIDE_K_CONFIGS + row_configs(896, 1)
    assert candidate_configs(896, 132, 896, 3) == CONFIGS + WIDE_K_CONFIGS


# one program per "SM" (4 under the interpreter) so that each walks several blocks
ROW_CASES = [(2, 512, 4, 1), (8, 512, 4, 2), (4, 512, 8, 8)]


@pytest.mark.parametrize("config", ROW_CASES, ids=[str(c) for c in ROW_CASES])
@pytest.mark.parametrize("prologue", ["none", "rmsnorm", "rmsnorm_residual", "silu_mul"])
@pytest.mark.parametrize("n", [70, 3])
def test_row_kernel_matches_torch(n, prologue, config):
    """The one-row kernel (`_gemv_row_kernel`) against torch: N = 70 walks blocks 0..34 over
    4-32 programs (fewer blocks than programs at N = 3), K = 300 under its 512-column row,
    every prologue, with and without bias; program 0 writes the new residual."""
    from pagedrt.ops.gemv_triton import gemv_rmsnorm_triton, gemv_silu_mul_triton

    g = torch.Generator().manual_seed(n + config[0] + len(prologue))
    k = 300
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g)
    for bias in (None, b):
        if prologue == "none":
            x = torch.randn(1, k, generator=g)
            got, want = gemv_triton(x, w, bias, config), F.linear(x, w, bias)
        elif prologue == "silu_mul":
            x = torch.randn(1, 2 * k, generator=g)
            got = gemv_silu_mul_triton(x, w, bias, config)
            want = F.linear(F.silu(x[:, :k]) * x[:, k:], w, bias)
        else:
            x, norm_w = torch.randn(1, k, generator=g), torch.randn(k, generator=g)
            res = torch.randn(1, k, generator=g) if prologue == "rmsnorm_residual" else None
            got, new_res = gemv_rmsnorm_triton(x, res, norm_w, 1e-6, w, bias, config)
            h = x + res if res is not None else x
            if res is not None:
                torch.testing.assert_close(new_res, h)
            else:
                assert new_res is None
            normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w
            want = F.linear(normed, w, bias)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_row_kernel_over_a_long_row_in_half_precision():
    """K = 4,864 (Qwen2-0.5B's down projection) with its own row config, bf16 (the products
    in fp32, as the grid kernel)."""
    g = torch.Generator().manual_seed(3)
    k = 4864
    x = torch.randn(1, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(9, k, generator=g) * 0.05).to(torch.bfloat16)
    for config in row_configs(k, 1):
        got = gemv_triton(x, w, None, config).float()
        torch.testing.assert_close(got, x.float() @ w.float().T, rtol=2e-2, atol=2e-2)


def test_row_config_is_refused_for_more_rows_or_a_longer_row():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"one-row config .* got 2 rows of K = 8"):
        gemv_triton(x, w, None, (2, 16, 4, 1))
    with pytest.raises(ValueError, match=r"for K <= 16; got 1 rows of K = 32"):
        gemv_triton(torch.randn(1, 32), torch.randn(4, 32), None, (2, 16, 4, 1))
