"""Compile the decode matmul's variants (pagedrt/ops/matmul_triton.py: whole K, split-K, the
SwiGLU epilogue; pagedrt/ops/matmul_rope_triton.py: the QKV + RoPE epilogue), the 1-4-row QKV + RoPE kernel (pagedrt/ops/gemv_rope_triton.py) and
skinny matmul (gemv_triton.py) for the H200 (sm_90) without a GPU, and report what their
PTX holds: the matrix instructions (wgmma / mma), the asynchronous copies of a pipelined K loop
(cp.async), PDL's grid controls and the loads issued before its wait, and for the variants that
count arrivals the order of the partial stores, the barrier, the atomic and the loads after it
(`fused_reduce_order` of decode_ptx.py). A change that breaks a kernel's compilation or its
pipelining shows here on a CPU machine; tests/test_matmul_codegen.py runs it. Not a benchmark.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/matmul_ptx.py [--json] [--ptx-dir DIR]

Triton here may be newer than the device's (3.9 here, 3.6 on the H200).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_ptx import fused_reduce_order

from pagedrt.ops.gemv_rope_triton import _qkv_rope_kernel
from pagedrt.ops.gemv_triton import _gemv_kernel, pre_wait_columns, rstd_block
from pagedrt.ops.matmul_rope_triton import _matmul_rope_kernel
from pagedrt.ops.matmul_triton import _matmul_kernel

# name: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, swap_ab, split_k, silu)
CASES = {
    "whole K, swap": (16, 64, 128, 4, 5, True, 1, False),
    "whole K": (64, 64, 64, 4, 5, False, 1, False),
    "split-K 8, swap": (16, 64, 128, 4, 4, True, 8, False),
    "SwiGLU epilogue, swap": (16, 64, 128, 4, 5, True, 1, True),
    "whole K, narrow": (16, 16, 256, 2, 4, True, 1, False),
    "SwiGLU epilogue, narrow": (16, 16, 128, 1, 4, True, 1, True),
}
MATRIX = r"(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)"


def compile_sm90(kernel, sig: dict, const: dict, aligned: list, options: dict):
    """`kernel` for sm_90: sig maps argument names to Triton types, const the constexprs;
    the arguments in `aligned` (pointers, strides, K and N as the engine's shapes give them)
    are declared multiples of 16."""
    sig = {**sig, **dict.fromkeys(const, "constexpr")}
    names = list(sig)
    src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_matmul(block_m, block_n, block_k, num_warps, num_stages, swap_ab, split_k, silu):
    ptrs = ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "part_ptr", "counters_ptr"]
    types = ["*bf16", "*bf16", "*bf16", "*bf16", "*fp32", "*i32"]
    sig = {**dict(zip(ptrs, types, strict=True)), "M": "i32", "N": "i32", "K": "i32",
           "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32"}
    const = {"HAS_BIAS": False, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
             "SPLIT_K": split_k, "SILU_MUL": silu, "SWAP_AB": swap_ab, "EVEN_K": True,
             "IEEE": False, "UPCAST": False, "PDL": True}
    aligned = ptrs + ["N", "K", "stride_xm", "stride_wn", "stride_ym"]
    return compile_sm90(_matmul_kernel, sig, const, aligned,
                        {"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": True})


def compile_qkv_rope(m: int = 1, block_p: int = 8, block_k: int = 256, num_warps: int = 4):
    ptrs = ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "r_ptr", "nw_ptr", "new_r_ptr",
            "positions_ptr", "cos_sin_ptr", "slot_mapping_ptr", "k_cache_ptr", "v_cache_ptr"]
    types = ["*bf16"] * 7 + ["*i64", "*fp32", "*i64", "*bf16", "*bf16"]
    ints = ["num_pairs", "K", "q_size", "kv_size", "stride_xm", "stride_wn", "stride_rm",
            "stride_c", "stride_cb", "stride_cs", "stride_ch", "stride_vb", "stride_vs",
            "stride_vh"]
    sig = {**dict(zip(ptrs, types, strict=True)), **dict.fromkeys(ints, "i32"), "eps": "fp32"}
    const = {"M": m, "M_PAD": max(2, triton.next_power_of_2(m)), "HEAD_DIM": 64, "HALF": 32,
             "BLOCK_SIZE": 16, "HAS_BIAS": True, "BLOCK_P": block_p, "BLOCK_K": block_k,
             "PROLOGUE": 1, "HAS_RESIDUAL": True, "RSTD_BLOCK": 1024, "PDL": True,
             "PRE_K": pre_wait_columns(2 * block_p, 896, num_warps)}
    return compile_sm90(_qkv_rope_kernel, sig, const, ptrs + ints,
                        {"num_warps": num_warps, "launch_pdl": True})


def compile_gemv(m: int = 1, prologue: int = 1, block_n: int = 8, block_k: int = 256,
                 num_warps: int = 4, k: int = 896):
    """The 1-4-row skinny matmul (pagedrt/ops/gemv_triton.py) with a prologue (0 none, 1
    RMSNorm with a residual, 2 SwiGLU's activation) over K columns, as the engine launches it
    with PDL."""
    ptrs = ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "r_ptr", "nw_ptr", "new_r_ptr"]
    ints = ["N", "K", "stride_xm", "stride_wn", "stride_rm"]
    sig = {**dict.fromkeys(ptrs, "*bf16"), **dict.fromkeys(ints, "i32"), "eps": "fp32"}
    const = {"M": m, "M_PAD": max(2, triton.next_power_of_2(m)), "HAS_BIAS": False,
             "BLOCK_N": block_n, "BLOCK_K": block_k, "PROLOGUE": prologue,
             "HAS_RESIDUAL": prologue == 1, "RSTD_BLOCK": rstd_block(k), "PDL": True,
             "PRE_K": pre_wait_columns(block_n, k, num_warps)}
    return compile_sm90(_gemv_kernel, sig, const, ptrs + ints,
                        {"num_warps": num_warps, "launch_pdl": True})


def loads_before_wait(ptx: str) -> int:
    """Global loads the PTX issues before its first griddepcontrol.wait (PDL: reads of what
    no earlier kernel writes, the weights); 0 without a wait."""
    wait = ptx.find("griddepcontrol.wait")
    return len(re.findall(r"ld\.global", ptx[:wait])) if wait >= 0 else 0


def compile_matmul_rope(block_m, block_n, block_k, num_warps, num_stages, swap_ab):
    ptrs = ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "positions_ptr", "cos_sin_ptr",
            "slot_mapping_ptr", "k_cache_ptr", "v_cache_ptr"]
    types = ["*bf16"] * 4 + ["*i64", "*fp32", "*i64", "*bf16", "*bf16"]
    ints = ["M", "K", "num_pairs", "q_size", "kv_size", "stride_xm", "stride_wn", "stride_c",
            "stride_cb", "stride_cs", "stride_ch", "stride_vb", "stride_vs", "stride_vh"]
    sig = {**dict(zip(ptrs, types, strict=True)), **dict.fromkeys(ints, "i32")}
    const = {"HEAD_DIM": 64, "HALF": 32, "BLOCK_SIZE": 16, "HAS_BIAS": True,
             "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "SWAP_AB": swap_ab,
             "EVEN_K": True, "IEEE": False, "UPCAST": False, "PDL": True}
    aligned = ptrs + [n for n in ints if n != "M"]
    return compile_sm90(_matmul_rope_kernel, sig, const, aligned,
                        {"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": True})


def barrier_before_each_atom(ptx: str) -> bool:
    """Whether a bar.sync stands between every atomic and the last global store before it
    (every thread's stores before the one thread's arrival; a kernel with no atomic: True)."""
    for atom in re.finditer(r"atom\.[\w:.]+", ptx):
        before = ptx[:atom.start()]
        if "bar.sync" not in before[max(before.rfind("st.global"), 0):]:
            return False
    return True


def summary(ptx: str) -> dict:
    return {"matrix": dict(Counter(re.findall(MATRIX, ptx))),
            "cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
            "griddepcontrol": dict(Counter(re.findall(r"griddepcontrol\.\w+", ptx))),
            "arrivals": fused_reduce_order(ptx),
            "loads_before_wait": loads_before_wait(ptx),
            "barrier_before_each_atom": barrier_before_each_atom(ptx)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true")
    p.add_argument("--ptx-dir", default=None)
    args = p.parse_args()
    results = {}
    kernels = {name: (compile_matmul, case) for name, case in CASES.items()}
    kernels["QKV + RoPE epilogue, swap"] = (compile_matmul_rope, (16, 64, 128, 4, 5, True))
    kernels["QKV + RoPE epilogue, 32 pairs"] = (compile_matmul_rope, (16, 32, 128, 4, 4, True))
    kernels["QKV + RoPE, 1 row"] = (compile_qkv_rope, (1,))
    kernels["QKV + RoPE, 4 rows"] = (compile_qkv_rope, (4,))
    kernels["gemv + RMSNorm, 1 row"] = (compile_gemv, (1, 1))
    kernels["gemv + SwiGLU, 1 row, K 4864"] = (compile_gemv, (1, 2, 4, 512, 4, 4864))
    kernels["gemv, 4 rows"] = (compile_gemv, (4, 0))
    kernels["gemv + SwiGLU, 1 row, K 4864, 4x2048 tile"] = (compile_gemv,
                                                            (1, 2, 4, 2048, 8, 4864))
    kernels["gemv + SwiGLU, 4 rows, K 4864, 4x2048 tile"] = (compile_gemv,
                                                             (4, 2, 4, 2048, 8, 4864))
    for name, (fn, case) in kernels.items():
        ptx = fn(*case).asm["ptx"]
        results[name] = summary(ptx)
        if args.ptx_dir:
            os.makedirs(args.ptx_dir, exist_ok=True)
            with open(os.path.join(args.ptx_dir, re.sub(r"\W+", "_", name) + ".ptx"), "w") as f:
                f.write(ptx)
        if not args.json:
            print(f"{name:36s} {results[name]}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
