"""The decode matmul's variants and the QKV + RoPE kernel as compiled for the H200 (sm_90), on
a CPU (benchmarks/diagnostics/matmul_ptx.py in a subprocess without TRITON_INTERPRET): they
compile, the tiled matmul's K loop stays on Hopper's wgmma with asynchronous copies in every
variant (the second weight row set of the SwiGLU and RoPE epilogues too), and split-K orders
its arrivals as its last-arriver scheme needs (pagedrt/ops/matmul_triton.py): a barrier
between the stores and each atomic, acq_rel at GPU scope, the other programs' data read
through L2 (.cg)."""

from __future__ import annotations

import pytest
from ptx_report import ptx_report

pytest.importorskip("triton")

MATMULS = ["whole K, swap", "whole K", "split-K 8, swap", "SwiGLU epilogue, swap",
           "QKV + RoPE epilogue, swap"]


@pytest.fixture(scope="module")
def compiled() -> dict:
    return ptx_report("matmul_ptx.py")


@pytest.mark.parametrize("case", MATMULS)
def test_matmuls_run_wgmma_from_pipelined_copies(compiled, case):
    got = compiled[case]
    assert any(k.startswith("wgmma.mma_async") for k in got["matrix"]), got["matrix"]
    assert got["cp_async"] > 0
    assert got["griddepcontrol"] == {"griddepcontrol.wait": 1,
                                     "griddepcontrol.launch_dependents": 1}


@pytest.mark.parametrize("case", ["QKV + RoPE epilogue, 32 pairs", "whole K, narrow",
                                  "SwiGLU epilogue, narrow"])
def test_narrow_tiles_run_ampere_mma_from_pipelined_copies(compiled, case):
    """32 pairs or 16 weight rows a program (matmul_triton.CONFIGS' narrow tiles): the weight
    side of the swapped product is under wgmma's 64 rows, so Triton emits mma.sync, still fed
    by asynchronous copies."""
    got = compiled[case]
    assert got["matrix"] and all(k.startswith("mma.sync") for k in got["matrix"])
    assert got["cp_async"] > 0
    assert got["griddepcontrol"] == {"griddepcontrol.wait": 1,
                                     "griddepcontrol.launch_dependents": 1}


@pytest.mark.parametrize("case", ["SwiGLU epilogue, swap", "QKV + RoPE epilogue, swap"])
def test_two_row_set_epilogues_pipeline_both_weight_halves(compiled, case):
    """SwiGLU's gate and up rows, RoPE's two halves of each head: two MMAs per K step, both
    weight tiles copied asynchronously."""
    plain, two = compiled["whole K, swap"], compiled[case]
    assert sum(two["matrix"].values()) == 2 * sum(plain["matrix"].values())
    assert two["cp_async"] > plain["cp_async"]


def test_arrivals_are_ordered(compiled):
    got = compiled["split-K 8, swap"]
    assert got["arrivals"]["atoms"] == {"atom.global.gpu.acq_rel.add.u32": 1}
    assert got["barrier_before_each_atom"]
    loads = got["arrivals"]["loads_after_atom"]
    assert sum(n for k, n in loads.items() if ".cg" in k) >= 8


@pytest.mark.parametrize("case", ["QKV + RoPE, 1 row", "QKV + RoPE, 4 rows"])
def test_qkv_rope_compiles_with_pdl(compiled, case):
    assert compiled[case]["griddepcontrol"] == {"griddepcontrol.wait": 1,
                                                "griddepcontrol.launch_dependents": 1}
    assert not compiled[case]["arrivals"]["atoms"]


@pytest.mark.parametrize("case", ["QKV + RoPE, 1 row", "QKV + RoPE, 4 rows",
                                  "gemv + RMSNorm, 1 row", "gemv + SwiGLU, 1 row, K 4864",
                                  "gemv, 4 rows", "gemv + SwiGLU, 1 row, K 4864, 4x2048 tile",
                                  "gemv + SwiGLU, 4 rows, K 4864, 4x2048 tile"])
def test_small_batch_kernels_load_weights_before_the_pdl_wait(compiled, case):
    """The 1-4-row kernels issue their first weight columns (`pre_wait_columns`) before
    griddepcontrol.wait, so the weights stream while the kernel before runs, and nothing
    else: exactly the 16-byte loads of the pre-loaded weights (8 rows x 1,024 columns, or 16 x
    512 for the RoPE kernel's two row sets, or 4 x 2,048 over 128 threads; 4 x 4,096 over
    the 4 x 2,048 tile's 256: eight 16-byte loads per thread each time), so an activation load moved above the wait would
    show; and only one wait."""
    got = compiled[case]
    assert got["griddepcontrol"]["griddepcontrol.wait"] == 1
    assert got["loads_before_wait"] == 8
