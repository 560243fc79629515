"""The decode and prefill projections under each BLAS library torch can route F.linear to
(`torch.backends.cuda.preferred_blas_library`: "cublas", torch's default, and "cublaslt"),
to see whether the 256-row projections, which run far below both ceilings (docs/design.md,
"Overlapping attention with the projections: measured, not built"), get faster kernels from
cuBLASLt's heuristics. A probe for issue 16, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/blas_library.py --out DIR \
        [--rows 8,64,128,256,512,16384]

Shapes: Qwen2-0.5B's QKV (1,152 x 896, with bias), O (896 x 896), gate/up (9,728 x 896) and
down (896 x 4,864), bf16, random weights. Each (library, rows, shape) is checked against the
other library's output (within bf16 rounding), then timed as a CUDA graph of 24 calls over 24
distinct weights (as a step reads each layer's own), median of `bench_ms`. Prints us per call
and the ratio cuBLASLt / cuBLAS; writes DIR/blas_library.json.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

from pagedrt.bench.attention import bench_ms

SHAPES = {"qkv": (1152, 896, True), "o": (896, 896, False), "gate_up": (9728, 896, False),
          "down": (896, 4864, False)}
LAYERS = 24
LIBRARIES = ("cublas", "cublaslt")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="8,64,128,256,512,16384")
    args = p.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = {name: [((torch.randn(n, k, generator=gen, device="cuda") * 0.02).bfloat16(),
                       (torch.randn(n, generator=gen, device="cuda") * 0.02).bfloat16()
                       if bias else None) for _ in range(LAYERS)]
               for name, (n, k, bias) in SHAPES.items()}
    results = []
    for rows in rows_list:
        for name, (n, k, _) in SHAPES.items():
            x = torch.randn(rows, k, generator=gen, device="cuda").bfloat16()
            layer_weights = weights[name]
            row = {"rows": rows, "shape": name}
            outs = {}
            for lib in LIBRARIES:
                torch.backends.cuda.preferred_blas_library(lib)
                outs[lib] = F.linear(x, *layer_weights[0]).float()
                def step(x=x, layer_weights=layer_weights):
                    return [F.linear(x, w, b) for w, b in layer_weights]
                row[lib] = bench_ms(step) / LAYERS * 1e3  # us a call
            diff = (outs["cublas"] - outs["cublaslt"]).abs().max().item()
            scale = outs["cublas"].abs().max().item()
            if not diff <= 2e-2 * scale + 1e-3:
                raise SystemExit(f"{name} at {rows} rows: the libraries differ by {diff:.3g}")
            row["tflops"] = {lib: 2 * rows * n * k / (row[lib] * 1e-6) / 1e12 for lib in LIBRARIES}
            results.append(row)
            print(f"{rows:6d} {name:8s} cublas {row['cublas']:8.2f} us  cublaslt "
                  f"{row['cublaslt']:8.2f} us  ratio {row['cublaslt'] / row['cublas']:.3f}",
                  flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "blas_library.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}, us per call (24 weights per graph)")
    print(f"{'rows':>6s} {'shape':8s} {'cublas':>9s} {'cublaslt':>9s} {'lt/blas':>8s}")
    for r in results:
        print(f"{r['rows']:6d} {r['shape']:8s} {r['cublas']:9.2f} {r['cublaslt']:9.2f} "
              f"{r['cublaslt'] / r['cublas']:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
