"""The skinny matmul on the GPU: correctness against torch in bf16 and the timing choice,
for the linear layers of the Qwen2-0.5B and Llama-3-8B shapes at 1, 2 and 4 rows.

    PYTHONPATH=$PWD python3 benchmarks/gemv_gpu_check.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from pagedrt.ops import gemv_triton as g

SHAPES = {  # name -> (N, K, bias)
    "qwen2 qkv": (1152, 896, True), "qwen2 o": (896, 896, False),
    "qwen2 gate_up": (9728, 896, False), "qwen2 down": (896, 4864, False),
    "llama3 qkv": (6144, 4096, False), "llama3 o": (4096, 4096, False),
    "llama3 gate_up": (28672, 4096, False), "llama3 down": (4096, 14336, False),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    torch.manual_seed(0)
    rows, failures = [], 0
    for name, (n, k, has_bias) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        b = torch.randn(n, device="cuda").to(torch.bfloat16) if has_bias else None
        for m in (1, 2, 4):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = F.linear(x.float(), w.float(), b.float() if b is not None else None)
            torch_ms = do_bench(lambda x=x, w=w, b=b: F.linear(x, w, b))
            best = None
            for cfg in g.CONFIGS:
                y = g.gemv_triton(x, w, b, cfg)
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                ok = err < 1e-2
                failures += not ok
                ms = do_bench(lambda cfg=cfg, x=x, w=w, b=b: g.gemv_triton(x, w, b, cfg))
                if best is None or ms < best[1]:
                    best = (cfg, ms, err)
            choice = g.linear(x, w, b)  # runs the engine's own choice
            torch.testing.assert_close(choice.float(), ref, rtol=2e-2, atol=2e-2)
            bytes_w = n * k * 2
            rows.append({"shape": name, "m": m, "torch_us": 1e3 * torch_ms,
                         "triton_us": 1e3 * best[1], "config": best[0],
                         "torch_TBps": bytes_w / torch_ms / 1e9,
                         "triton_TBps": bytes_w / best[1] / 1e9, "max_rel_err": best[2],
                         "engine_choice": g._CHOICE[(w.shape, m, x.dtype, b is not None,
                                                     x.device.index)]})
    print(f"{'shape':<16} {'m':>2} {'torch us':>9} {'triton us':>9} {'torch TB/s':>10} "
          f"{'triton TB/s':>11} {'best cfg':>14} engine")
    for r in rows:
        print(f"{r['shape']:<16} {r['m']:>2} {r['torch_us']:>9.2f} {r['triton_us']:>9.2f} "
              f"{r['torch_TBps']:>10.2f} {r['triton_TBps']:>11.2f} {r['config']!s:>14} "
              f"{r['engine_choice']}")
    print("correctness failures:", failures)
    with open(os.path.join(args.out, "gemv_gpu_check.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
