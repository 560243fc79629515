"""The decode kernel's loads as compiled for the H200 (sm_90), on a CPU: Triton compiles to
PTX without a GPU (benchmarks/diagnostics/decode_ptx.py, run in a subprocess without
TRITON_INTERPRET), so a change that turns 16-byte copies into byte loads shows here, not only
as a slower kernel on the device.

Dim-major FP8 V (the FP8 default) read through a per-token mask against a loaded
seq_len compiled to one-byte loads of V, 128 per thread and tile (2x the time on the H200,
benchmarks/results/RUNS.md, "Runs of 2026-12-02 (03:20-03:55 UTC)"); the kernel now reads
full tiles unmasked (pagedrt/ops/attention_triton.py, module doc), so V comes by 16-byte
asynchronous copies there and byte loads remain only in a partition's last, partial tile."""

from __future__ import annotations

import os

import pytest
from ptx_report import ptx_report

pytest.importorskip("triton")

CG, B8 = "cp.async.cg.shared.global", "ld.global.b8"


@pytest.fixture(scope="module")
def loads() -> dict:
    return ptx_report("decode_ptx.py")


def test_dim_major_fp8_v_comes_by_16_byte_copies(loads):
    """Llama-3-8B heads (head_dim 128), BLOCK_N 128, 4 warps: a K or V tile is 16 KB, 128 bytes
    a thread; with V dim-major both come by cp.async.cg (16 bytes) in the pipelined loop, as
    with V token-major only K does (twice the copies); the masked tail tile may read V byte by
    byte (at most 128 a thread)."""
    dim_major = loads["fp8, V dim-major, Llama-3-8B heads"]
    token_major = loads["fp8, V token-major, Llama-3-8B heads"]
    assert dim_major.get(CG, 0) >= 2 * token_major[CG]
    assert dim_major.get(B8, 0) <= 128


@pytest.mark.parametrize("case", ["bf16, Llama-3-8B heads", "bf16, Qwen2-0.5B heads",
                                  "fp8, V token-major, Llama-3-8B heads"])
def test_other_paths_load_no_single_bytes(loads, case):
    """bf16 caches and FP8 with V token-major: no byte loads at all (their masks cut across
    the contiguous head_dim)."""
    assert loads[case].get(B8, 0) == 0 and loads[case].get(CG, 0) > 0


def test_pdl_waits_before_the_first_read(loads):
    """With PDL (`pdl_enabled`) the decode kernel and the warp-tile one are compiled with it:
    their PTX waits for the kernel before it (griddepcontrol.wait) ahead of any global read,
    and lets the next one launch; without, neither instruction is there."""
    for case in ("bf16, Llama-3-8B heads, PDL", "warp tiles, fp8, Qwen2-0.5B heads, PDL"):
        pdl = loads[case]
        assert pdl.get("griddepcontrol.wait") == 1, case
        assert pdl.get("griddepcontrol.launch_dependents") == 1, case
        assert 0 <= pdl["wait_at"] < pdl["first_read_at"], case
    plain = loads["bf16, Llama-3-8B heads"]
    assert "griddepcontrol.wait" not in plain and plain["wait_at"] == -1


def test_pdl_is_on_by_default_off_on_cpu_and_for_prefill(monkeypatch):
    """PDL is requested unless PAGEDRT_PDL=0 at import (`PDL_REQUESTED`); a CPU tensor (the
    interpreter) never launches with it, nor a launch over more than PDL_MAX_ROWS rows (a
    prefill); without it, launches pass only PDL=False."""
    import torch

    from pagedrt.ops import triton_utils

    assert triton_utils.PDL_REQUESTED == (os.environ.get("PAGEDRT_PDL") != "0")
    monkeypatch.setattr(triton_utils, "PDL_REQUESTED", True)
    assert not triton_utils.pdl_enabled(torch.zeros(1))
    if triton_utils.gdc_wait is not None:  # as on a GPU of compute capability 9.0
        monkeypatch.setattr(triton_utils, "interpreting", lambda t: False)
        monkeypatch.setattr(triton_utils, "_pdl_capable", lambda index: True)
        rows = triton_utils.PDL_MAX_ROWS
        assert triton_utils.pdl_enabled(torch.zeros(rows, 8))
        assert not triton_utils.pdl_enabled(torch.zeros(rows + 1, 8))
        monkeypatch.setattr(triton_utils, "PDL_REQUESTED", False)
        assert not triton_utils.pdl_enabled(torch.zeros(1, 8))
    assert triton_utils.pdl_launch(False) == {"PDL": False}
    assert triton_utils.pdl_launch(True) == {"PDL": True, "launch_pdl": True}
