"""Fingerprint the attention kernels' code for the H200 (sm_90) without a GPU: compile the
decode and extend kernels at the engine's settings (the cases of `decode_ptx.py`, and the
extend kernel over bf16, FP8, FP8 with the chunk's rows, FP8 products, the
wide tile, Qwen2-0.5B heads and a sliding window; the warp-tile decode kernel at three
launches), strip what only describes the source
(debug locations, their labels, comments, debug sections), and write each instruction stream
with its md5. A tool for refactors of the kernels' Triton source that should not change what
runs: identical streams before and after need no new timing on the GPU. Not a benchmark.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/ptx_fingerprint.py --out DIR
    (change the source)
    PYTHONPATH=$PWD python3 benchmarks/diagnostics/ptx_fingerprint.py --out DIR2 --compare DIR

With --compare it prints, per kernel, "same" or how many lines differ, and exits with status 1
if any differs. Used on 2026-12-02 for `online_softmax_step` (the online-softmax update shared
by the decode and extend kernels): all 17 streams unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys

from decode_ptx import CASES, compile_decode, compile_decode_warp
from extend_ptx import compile_extend

EXTEND_CASES = {  # name: compile_extend keyword arguments
    "extend bf16": {"fp8": False},
    "extend fp8": {"fp8": True},
    "extend fp8, chunk rows": {"fp8": True, "fresh": True},
    "extend fp8, FP8 products": {"fp8": True, "fp8_mma": True},
    "extend bf16, wide tile": {"fp8": False, "narrow": False},
    "extend bf16, Qwen2-0.5B heads": {"fp8": False, "head_dim": 64, "group": 7},
    "extend bf16, window 100": {"fp8": False, "window": 100},
}


WARP_CASES = {  # name: compile_decode_warp's arguments (head_dim, group, BLOCK_N, warps,
    # stages[, kv_heads_per_program, split])
    "warp tiles fp8, Llama-3-8B heads, 32/1/5": (128, 4, 32, 1, 5),
    "warp tiles fp8, Qwen2-0.5B heads, 32/1/5, split": (64, 7, 32, 1, 5, 1, True),
    "warp tiles fp8, Llama-3-8B heads, 128/4/5": (128, 4, 128, 4, 5),
}


def instruction_stream(ptx: str) -> str:
    """The PTX without what only maps it to the source: .loc / .file directives, comments,
    the $L__tmpN labels the debug locations use, and the .debug_* sections (which the PTX
    ends with)."""
    debug = re.search(r"^\s*\.section\s+\.debug", ptx, flags=re.MULTILINE)
    if debug:
        ptx = ptx[:debug.start()]
    keep = []
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith((".loc", ".file", "//")) or re.fullmatch(r"\$L__tmp\d+:", s):
            continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def kernels() -> dict[str, str]:
    """Case name -> the compiled kernel's PTX."""
    ptx = {f"decode {name}": compile_decode(*case).asm["ptx"] for name, case in CASES.items()}
    for name, kwargs in EXTEND_CASES.items():
        ptx[name] = compile_extend(**kwargs).asm["ptx"]
    for name, args in WARP_CASES.items():
        ptx[name] = compile_decode_warp(*args).asm["ptx"]
    return ptx


def file_name(case: str) -> str:
    return re.sub(r"\W+", "_", case).strip("_") + ".ptx"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="directory for the instruction streams")
    p.add_argument("--compare", default=None, help="a directory an earlier run wrote")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    differ = 0
    for case, ptx in kernels().items():
        stream = instruction_stream(ptx)
        with open(os.path.join(args.out, file_name(case)), "w") as f:
            f.write(stream)
        line = f"{case:52s} {hashlib.md5(stream.encode()).hexdigest()[:12]}"
        if args.compare:
            try:
                with open(os.path.join(args.compare, file_name(case))) as f:
                    before = f.read().splitlines()
            except FileNotFoundError:
                line += "  (not in --compare)"
            else:
                after = stream.splitlines()
                changed = sum(a != b for a, b in zip(before, after)) + abs(len(before) - len(after))
                line += "  same" if not changed else f"  DIFFERS ({changed} lines)"
                differ += bool(changed)
        print(line, flush=True)
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
