"""Does any Triton GEMM that torch's own autotuner knows beat cuBLAS on Qwen2-0.5B's decode
projections? `torch.compile(mode="max-autotune-no-cudagraphs")` over F.linear times cuBLAS
(ATen) against Inductor's Triton templates, the persistent TMA one included where the GPU has
TMA, and prints its table per shape ("AUTOTUNE mm(...)" on stderr). A probe for issue 16
(docs/design.md, "Overlapping attention with the projections: measured, not built": the
256-row projections are latency, and the engine's own Triton matmul lost to cuBLAS there), not
a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/inductor_gemm.py [--rows 256]
        [--ops gate_up,down,qkv,o]

Each compiled function is checked against F.linear first. Then both are timed the same way
(`bench_ms`, a CUDA graph of one call on one weight, so hot in L2), and the ratio printed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from pagedrt.bench.attention import bench_ms

SHAPES = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="256")
    p.add_argument("--ops", default="gate_up,down,qkv,o")
    args = p.parse_args(argv)
    import torch._inductor.config as inductor_config

    inductor_config.max_autotune_gemm_backends = "ATEN,TRITON"
    if hasattr(inductor_config.triton, "enable_persistent_tma_matmul"):
        inductor_config.triton.enable_persistent_tma_matmul = True
    rows_list = [int(r) for r in args.rows.split(",")]
    out = []
    for rows in rows_list:
        for op in args.ops.split(","):
            n, k = SHAPES[op]
            x = torch.randn(rows, k, device="cuda").bfloat16()
            w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
            torch._dynamo.reset()
            compiled = torch.compile(lambda a, b: F.linear(a, b),
                                     mode="max-autotune-no-cudagraphs", dynamic=False)
            got = compiled(x, w).float()
            want = F.linear(x, w).float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            if not err < 2e-2:
                raise SystemExit(f"{op} at {rows} rows: compiled differs by {err:.3g}")
            t_cublas = bench_ms(lambda x=x, w=w: F.linear(x, w)) * 1e3
            t_compiled = bench_ms(lambda x=x, w=w, f=compiled: f(x, w)) * 1e3
            out.append((rows, op, t_cublas, t_compiled))
            print(f"{rows:5d} {op:8s} cuBLAS {t_cublas:7.2f} us  compiled {t_compiled:7.2f} us",
                  flush=True)
    print(f"\n{torch.cuda.get_device_name()}, us per call (one weight, hot)")
    print(f"{'rows':>5s} {'op':8s} {'cuBLAS':>8s} {'compiled':>9s} {'ratio':>6s}")
    for rows, op, a, b in out:
        print(f"{rows:5d} {op:8s} {a:8.2f} {b:9.2f} {b / a:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
