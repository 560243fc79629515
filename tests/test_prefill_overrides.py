"""The prefill tuning override PAGEDRT_EXTEND_CONFIG (the extend kernel's launch config): its
parsing and errors, and, on CPU under TRITON_INTERPRET=1, the extend kernel at an overridden
config against the torch reference (a mixed batch: prompts, chunks over prefixes, decode rows
at block boundaries); and the fused gate/up kernel at a prefill tile config against the plain
path, as benchmarks/diagnostics/prefill_parts.py times it. Their CUDA runs are in
tests/gpu/."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from test_attention_triton import ATOL, make_paged_kv
from test_extend_decode_rows import _cu, _mixed_batch

from pagedrt.ops import attention_extend_triton as ext
from pagedrt.ops import attention_reference as ref
from pagedrt.ops import matmul_triton


@pytest.mark.parametrize("value", ["64,64,4", "64,64,4,x", "64,0,4,2", "-64,64,4,2"])
def test_extend_config_override_rejects_bad_values(value, monkeypatch):
    monkeypatch.setenv("PAGEDRT_EXTEND_CONFIG", value)
    with pytest.raises(ValueError, match="PAGEDRT_EXTEND_CONFIG.*BLOCK_M,BLOCK_N"):
        ext.extend_config_override()


def test_override_parses(monkeypatch):
    monkeypatch.delenv("PAGEDRT_EXTEND_CONFIG", raising=False)
    assert ext.extend_config_override() is None
    monkeypatch.setenv("PAGEDRT_EXTEND_CONFIG", " 64,32,4,2 ")
    assert ext.extend_config_override() == {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4,
                                            "num_stages": 2}


@pytest.mark.parametrize("group", [1, 7])
def test_extend_at_an_overridden_config_matches_the_reference(group, monkeypatch):
    """A 32-row tile (the interpreter's default is 16): the mixed batch's outputs still
    equal the reference's, and the launch took the override (the fitting-config cache holds
    its key)."""
    from pagedrt.ops.triton_utils import _FITTING_CONFIG

    seq_lens, q_lens = _mixed_batch(16)
    torch.manual_seed(group)
    k_cache, v_cache, bt, lens = make_paged_kv(seq_lens, 2, 32, 16, torch.float32)
    query = torch.randn(sum(q_lens), 2 * group, 32)
    args = (query, k_cache, v_cache, bt, _cu(q_lens), lens, 0.2)
    expected = ref.paged_attention_extend_reference(*args)
    monkeypatch.setenv("PAGEDRT_EXTEND_CONFIG", "32,16,4,1")
    out = ext.paged_attention_extend_triton(*args)
    assert torch.isfinite(out).all()
    assert (out - expected).abs().max() <= ATOL[torch.float32]
    assert any(key[0] == "extend" and key[-1] == (32, 16, 4, 1) for key in _FITTING_CONFIG)


def test_fused_gate_up_at_a_prefill_tile_matches_the_plain_path():
    """matmul_triton's silu_mul at a 64-row tile over 200 rows (past MAX_ROWS, a partial last
    row tile) and a K no BLOCK_K divides, in fp32: silu(x @ gate.T) * (x @ up.T)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, 72, generator=g)
    w = torch.randn(2 * 48, 72, generator=g) * 0.1
    gate, up = torch.nn.functional.linear(x, w).chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = matmul_triton.matmul_triton(x, w, None, (64, 32, 32, 4, 1, False), silu_mul=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
