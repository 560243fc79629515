"""Compile the decode-attention kernel for the H200 (sm_90) without a GPU and count the global
loads of its PTX by width: 16-byte asynchronous copies (cp.async.cg) against one-byte loads
(ld.global.b8). A diagnostic for issue 17: it showed, on a CPU-only machine, why the kernel
read dim-major FP8 V at half the speed of a stripped copy (byte loads from a per-token mask
against a seq_len of unknown alignment; pagedrt/ops/attention_triton.py, module doc), and
checks a change to the kernel's loads before it meets a GPU, and prints ptxas's registers and
stack frame (spills) per thread of each case. Not a benchmark. `fused_reduce_order` reads how
a kernel that counts arrivals (pagedrt/ops/arrival_counters.py) orders its partial stores, the
barrier, the atomic and the loads of the other programs' partials, which a CPU test cannot
see (matmul_ptx.py uses it for the split-K matmul).

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/decode_ptx.py [--ptx-dir DIR] [--json]

Each case is compiled with the arguments' alignment as the engine's launches give it (every
pointer and every stride but the unit one a multiple of 16). Triton here may be newer than
the device's; the analysis that decides a load's width is the same in both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import Counter

import triton
from extend_ptx import cubin_resources  # (this folder)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pagedrt.ops.attention_triton import _decode_kernel

INTS = ["stride_qs", "stride_qh", "stride_cb", "stride_cs", "stride_ch", "stride_vb", "stride_vs",
        "stride_vh", "stride_vd", "stride_sb", "stride_sh", "stride_bt", "stride_os", "stride_oh",
        "num_splits"]
CASES = {  # name: (fp8, V dim-major, head_dim, group, BLOCK_N, window)
    "bf16, Llama-3-8B heads": (False, False, 128, 4, 64, 0),
    "bf16, Qwen2-0.5B heads": (False, False, 64, 7, 128, 0),
    "fp8, V token-major, Llama-3-8B heads": (True, False, 128, 4, 128, 0),
    "fp8, V dim-major, Llama-3-8B heads": (True, True, 128, 4, 128, 0),
    "fp8, V dim-major, Qwen2-0.5B heads": (True, True, 64, 7, 128, 0),
    "fp8, V dim-major, window 100": (True, True, 128, 4, 128, 100),
    "bf16, Llama-3-8B heads, PDL": (False, False, 128, 4, 64, 0, 4, 3, True),
}


def compile_decode(fp8: bool, dim_major: bool, head_dim: int, group: int, block_n: int,
                   window: int, num_warps: int = 4, num_stages: int = 3, pdl: bool = False):
    """The decode kernel, unsplit, compiled for sm_90 with the engine's alignment; returns
    Triton's compiled kernel (its .asm has "ttgir" and "ptx")."""
    cache = "*fp8e4nv" if fp8 else "*bf16"
    sig = {"q_ptr": "*bf16", "k_cache_ptr": cache, "v_cache_ptr": cache,
           "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "out_ptr": "*bf16",
           "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "k_scales_ptr": "*fp32",
           "v_scales_ptr": "*fp32", "scale_log2": "fp32", **dict.fromkeys(INTS, "i32")}
    const = {"GROUP": group, "GROUP_PAD": 16, "BLOCK_SIZE": 16, "HEAD_DIM": head_dim,
             "BLOCK_N": block_n, "SPLIT": False, "UPCAST": False, "DOT_PRECISION": "tf32",
             "KV_FP8": fp8, "F16_MMA": fp8, "WINDOW": window, "V_DIM_MAJOR": dim_major,
             "PDL": pdl}
    return compile_sm90(_decode_kernel, sig, const,
                        {"num_splits", "stride_vs" if dim_major else "stride_vd"},
                        {"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": pdl})


def compile_sm90(kernel, sig: dict, const: dict, unit: set, options: dict):
    """`kernel` compiled for sm_90: sig maps argument names to Triton types, const the
    constexprs (their values), and every pointer and every integer of INTS but those in
    `unit` is declared a multiple of 16, as the engine's launches give them."""
    sig = {**sig, **dict.fromkeys(const, "constexpr")}
    names = list(sig)
    aligned = [n for n in names if sig[n].startswith("*")] + [n for n in INTS if n not in unit]
    src = ASTSource(kernel, sig,
                    constexprs={(names.index(k),): v for k, v in const.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_decode_warp(head_dim: int, group: int, block_n: int, num_warps: int,
                        num_stages: int, kv_heads_per_program: int = 1, split: bool = False,
                        pdl: bool = False, fp8: bool = True):
    """The warp-tile decode kernel (`attention_decode_warp_triton`) over an FP8 cache with V
    dim-major (or, without `fp8`, a bf16 cache with V in K's layout), bf16 queries, compiled
    for sm_90 as `compile_decode` compiles `_decode_kernel`. kv_heads_per_program: KVH, which
    only trees before 2026-12-06 have (so that a fingerprint of one compiles); today's kernel
    takes one KV head a program."""
    from pagedrt.ops.attention_decode_warp_triton import _decode_warp_kernel, warp_tile_shape
    sub, sub_n = warp_tile_shape(block_n)
    cache = "*fp8e4nv" if fp8 else "*bf16"
    sig = {"q_ptr": "*bf16", "k_cache_ptr": cache, "v_cache_ptr": cache,
           "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "out_ptr": "*bf16",
           "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "k_scales_ptr": "*fp32",
           "v_scales_ptr": "*fp32", "scale_log2": "fp32", **dict.fromkeys(INTS, "i32")}
    const = {"GROUP": group, "GROUP_PAD": 16, "BLOCK_SIZE": 16, "HEAD_DIM": head_dim,
             "SUB": sub, "SUB_N": sub_n, "SPLIT": split, "UPCAST": False,
             "DOT_PRECISION": "tf32", "KV_FP8": fp8, "F16_MMA": fp8, "V_DIM_MAJOR": fp8,
             "PDL": pdl}
    if "KVH" in _decode_warp_kernel.arg_names:
        const["KVH"] = kv_heads_per_program
    elif kv_heads_per_program != 1:
        raise ValueError(f"kv_heads_per_program={kv_heads_per_program}: this tree's warp-tile "
                         "kernel takes one KV head a program")
    return compile_sm90(_decode_warp_kernel, sig, const,
                        {"num_splits", "stride_vs" if fp8 else "stride_vd"},
                        {"num_warps": num_warps, "num_stages": num_stages,
                         **({"launch_pdl": True} if pdl else {})})


def load_widths(ptx: str) -> Counter:
    """Global loads and asynchronous copies in the PTX, by instruction, and the grid
    dependency controls of programmatic dependent launch (griddepcontrol.*)."""
    return Counter(re.findall(
        r"(ld\.global[\w.]*|cp\.async\.c[ag]\.shared\.global|griddepcontrol\.\w+)", ptx))


def fused_reduce_order(ptx: str) -> dict:
    """How the PTX of a kernel that counts arrivals orders what the last program's combine
    relies on (pagedrt/ops/arrival_counters.py; matmul_ptx.py's split-K cases): its atomics (instruction -> count); whether a bar.sync stands
    between the last global store before the first atomic (the partials) and that atomic;
    and the global loads after it (instruction -> count), which must all bypass L1 (.cg)."""
    atom = re.search(r"atom\.[\w:.]+", ptx)
    if atom is None:
        return {"atoms": {}}
    before = ptx[:atom.start()]
    last_store = max(before.rfind("st.global"), 0)
    return {"atoms": dict(Counter(re.findall(r"atom\.[\w:.]+", ptx))),
            "barrier_before_atom": "bar.sync" in before[last_store:],
            "loads_after_atom": dict(Counter(re.findall(
                r"(ld\.global[\w.]*|cp\.async\.c[ag]\.shared\.global)", ptx[atom.end():])))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ptx-dir", default=None, help="also write each case's PTX here")
    p.add_argument("--json", action="store_true",
                   help="print {case: {instruction: count}} as JSON instead of the table")
    args = p.parse_args()
    counts = {}
    kernels = {name: (compile_decode, case) for name, case in CASES.items()}
    # the warp-tile kernel, split, with PDL
    kernels["warp tiles, fp8, Qwen2-0.5B heads, PDL"] = (compile_decode_warp,
                                                         (64, 7, 32, 1, 5, 1, True, True))
    kernels["warp tiles, bf16, Qwen2-0.5B heads, PDL"] = (
        compile_decode_warp, (64, 7, 32, 1, 5, 1, True, True, False))
    # unsplit at head_dim 128 (ptxas spills there over FP8)
    kernels["warp tiles, fp8, Llama-3-8B heads, PDL"] = (
        compile_decode_warp, (128, 4, 32, 1, 5, 1, False, True, True))
    for name, (compile_fn, case) in kernels.items():
        asm = compile_fn(*case).asm
        ptx = asm["ptx"]
        counts[name] = dict(load_widths(ptx))
        # ptxas's registers and spills per thread
        counts[name]["resources"] = cubin_resources(asm["cubin"])
        # where the first global read and the PDL wait stand in the PTX (character offsets)
        first_read = re.search(r"ld\.global|cp\.async\.c[ag]", ptx)
        wait = ptx.find("griddepcontrol.wait")
        counts[name]["first_read_at"] = first_read.start() if first_read else -1
        counts[name]["wait_at"] = wait
        counts[name]["reads_before_wait"] = dict(load_widths(ptx[:max(wait, 0)]))
        if args.ptx_dir:
            os.makedirs(args.ptx_dir, exist_ok=True)
            with open(os.path.join(args.ptx_dir, re.sub(r"\W+", "_", name) + ".ptx"), "w") as f:
                f.write(ptx)
        if not args.json:
            print(f"{name:40s} " + ", ".join(f"{k} x{v}" for k, v in
                                             load_widths(ptx).most_common()))
            print(f"{'':40s} {counts[name]['resources']}")
    if args.json:
        print(json.dumps(counts))


if __name__ == "__main__":
    main()
