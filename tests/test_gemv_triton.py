"""The skinny matmul kernel (pagedrt/ops/gemv_triton.py) against torch, under the Triton
interpreter on CPU: every row count it serves, every tile config, ragged N and K, bias."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

from pagedrt.ops.gemv_triton import CONFIGS, MAX_ROWS, gemv_triton, linear


@pytest.mark.parametrize("config", CONFIGS, ids=[f"n{c[0]}k{c[1]}w{c[2]}" for c in CONFIGS])
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
