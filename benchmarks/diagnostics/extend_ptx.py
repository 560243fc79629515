"""Compile the extend (prefill) attention kernel for the H200 (sm_90) without a GPU and count,
in its PTX, the tensor-core instructions against the e4m3 -> fp16 conversions, for a bf16 and
an FP8 cache at the launch config the engine uses (`_extend_launch_configs`). A diagnostic for
issue 17: on the H200 a prefill step of the Llama-3-8B shape over an FP8 cache took 548 ms
against 414 over bf16 (benchmarks/results/RUNS.md, "Runs of 2026-12-02 (08:30-09:00 UTC)").
Both kernels use Hopper's warpgroup MMA (wgmma), which reads its K and V operands from shared
memory: the bf16 kernel straight from its asynchronous copies, the FP8 one only after each
thread has loaded its share of the fp8 tile into registers, converted it (cvt.rn.f16x2.e4m3x2)
and stored the fp16 values back (st.shared), a round trip per tile that the bf16 kernel does
not make. Not a benchmark.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/extend_ptx.py

The third case is the FP8-product variant (`fp8_prefill_mma_requested`), which should show
FP8 warpgroup MMAs and no e4m3 -> fp16 conversions. Each case is compiled without and with the
narrow tile for one-token chunks (NARROW_M), and prints ptxas's registers per thread and stack
frame per thread (spills) read from the cubin: over an FP8 cache at BLOCK_M 256 the frame is
824 bytes (the 2.4x slower config, benchmarks/results/RUNS.md, "Runs of 2026-12-02
(11:50-12:30 UTC)"), at BLOCK_M 128 8 bytes.
"""

from __future__ import annotations

import re
import struct
from collections import Counter

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pagedrt.ops.attention_extend_triton import _extend_kernel, _extend_launch_configs

INTS = ["stride_qt", "stride_qh", "stride_cb", "stride_cs", "stride_ch", "stride_vb",
        "stride_vs", "stride_vh", "stride_vd", "stride_sb", "stride_sh", "stride_knt",
        "stride_knh", "stride_vnt", "stride_vnh", "stride_bt", "stride_ot", "stride_oh"]


def compile_extend(fp8: bool, head_dim: int = 128, group: int = 4, cfg: dict | None = None,
                   fp8_mma: bool = False, fresh: bool = False, narrow: bool = True,
                   window: int = 0):
    """The extend kernel for sm_90, Llama-3-8B heads by default, V dim-major over FP8;
    fp8_mma: its FP8-product variant (PAGEDRT_FP8_PREFILL_MMA=1); fresh: the chunk's keys
    from the step's rows (FRESH_CHUNK_KV, the engine's prefill over an FP8 cache); window:
    a sliding window in tokens (WINDOW; 0 none)."""
    cfg = cfg or _extend_launch_configs(head_dim, torch.bfloat16, on_gpu=True, kv_fp8=fp8)[0]
    cache = "*fp8e4nv" if fp8 else "*bf16"
    sig = {"q_ptr": "*bf16", "k_cache_ptr": cache, "v_cache_ptr": cache,
           "block_tables_ptr": "*i32", "cu_seqlens_q_ptr": "*i32", "seq_lens_ptr": "*i32",
           "out_ptr": "*bf16", "k_scales_ptr": "*fp32", "v_scales_ptr": "*fp32",
           "k_new_ptr": "*bf16", "v_new_ptr": "*bf16", "scale_log2": "fp32",
           **dict.fromkeys(INTS, "i32")}
    const = {"GROUP": group, "TOKENS_PER_TILE": cfg["BLOCK_M"] // group,
             "BLOCK_M": cfg["BLOCK_M"], "BLOCK_SIZE": 16, "HEAD_DIM": head_dim,
             "BLOCK_N": cfg["BLOCK_N"], "UPCAST": False, "DOT_PRECISION": "tf32",
             "KV_FP8": fp8, "F16_MMA": fp8, "WINDOW": window, "V_DIM_MAJOR": fp8,
             "FP8_MMA": fp8_mma, "FRESH_CHUNK_KV": fresh,
             "NARROW_M": 0 if fp8_mma or not narrow else 16}
    sig.update(dict.fromkeys(const, "constexpr"))
    names = list(sig)
    unit = {"stride_vs" if fp8 else "stride_vd"}
    aligned = [n for n in names if sig[n].startswith("*")] + [n for n in INTS if n not in unit]
    src = ASTSource(_extend_kernel, sig,
                    constexprs={(names.index(k),): v for k, v in const.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"],
                                   "num_stages": cfg["num_stages"]})


def cubin_resources(cubin: bytes) -> dict:
    """Registers per thread and stack frame bytes per thread (spills) of the one kernel in a
    cubin, from the EIATTR_REGCOUNT (0x2f) and EIATTR_FRAME_SIZE (0x12) entries of its ELF
    `.nv.info` section (each entry: format byte, attribute byte, then for format 4 a 16-bit
    size and that many bytes: a symbol index and the value)."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
                for i in range(shnum)]
    names = sections[shstrndx][4]
    out = {}
    for name, _, _, _, off, size in sections:
        if cubin[names + name:cubin.index(b"\0", names + name)] != b".nv.info":
            continue
        p = off
        while p < off + size:
            fmt, attr = cubin[p], cubin[p + 1]
            if fmt != 4:  # 1: no value, 2: a byte, 3: a half word (each padded to 4 here)
                p += 2 if fmt == 1 else 4
                continue
            n = struct.unpack_from("<H", cubin, p + 2)[0]
            if attr in (0x2F, 0x12):
                out["registers" if attr == 0x2F else "frame_bytes"] = struct.unpack_from(
                    "<II", cubin, p + 4)[1]
            p += 4 + n
    return out


def main() -> None:
    cases = ((False, False, False, None), (True, False, False, None), (True, True, False, None),
             (True, False, True, None),
             (True, False, True, {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 8,
                                  "num_stages": 3}))
    for fp8, fp8_mma, fresh, cfg in cases:
        for narrow in (False, True) if not fp8_mma else (False,):
            kernel = compile_extend(fp8, fp8_mma=fp8_mma, fresh=fresh, narrow=narrow, cfg=cfg)
            c = Counter(re.findall(r"(wgmma\.mma_async\S*|mma\.sync\S*|cvt\.rn\.f16x2\.e4m3x2|"
                                   r"st\.shared\S*|ld\.shared\S*|cp\.async\.c[ag]\S*)",
                                   kernel.asm["ptx"]))
            name = ("fp8, FP8 products" if fp8_mma else "fp8, chunk rows" if fresh
                    else "fp8" if fp8 else "bf16") + (", narrow" if narrow else "")
            if cfg:
                name += f" at BLOCK_M {cfg['BLOCK_M']}"
            print(f"{name:38s}", cubin_resources(kernel.asm["cubin"]), "shared",
                  kernel.metadata.shared, dict(c.most_common(6)))


if __name__ == "__main__":
    main()
