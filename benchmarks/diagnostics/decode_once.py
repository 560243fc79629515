"""Run the decode-attention kernel a few times on one shape, for a profiler to watch (Nsight
Compute: `ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2
--launch-count 1 --section WarpStateStats --section SchedulerStats --section
MemoryWorkloadAnalysis python3 benchmarks/diagnostics/decode_once.py --kv-cache-dtype fp8`).
A diagnostic for issue 17: the FP8 kernel reads its bytes at about half the bf16 kernel's rate
(benchmarks/results/RUNS.md, "Runs of 2026-12-02 (06:00-06:30 UTC)"; this script's Nsight
Compute figures: "Runs of 2026-12-02 (08:30-09:00 UTC)"), so it is bound by something else,
and only the hardware counters say what (stall reasons, issue slots, shared-memory traffic).
Not a benchmark.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/decode_once.py [--case llama3-8b:64:4096]
        [--kv-cache-dtype auto|fp8] [--runs 4]

The cache is built as `benchmarks/decode_tune.py` builds it (random bf16, shuffled blocks of
16; FP8 quantized per token and head, V stored as the engine would: PAGEDRT_FP8_V_DIM_MAJOR).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.decode_tune import MODELS, make_case
from pagedrt.bench.attention import fp8_cache
from pagedrt.kv.kv_cache import fp8_v_dim_major_requested
from pagedrt.ops.attention_triton import paged_attention_decode_triton
from pagedrt.ops.triton_utils import to_v_dim_major


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="llama3-8b:64:4096", help="MODEL:NUM_SEQS:CTX")
    p.add_argument("--kv-cache-dtype", default="fp8", choices=["auto", "fp8"])
    p.add_argument("--runs", type=int, default=4)
    args = p.parse_args()
    model, num_seqs, ctx = args.case.split(":")
    h, kvh, d = MODELS[model]
    q, k, v, bt, sl = make_case(int(num_seqs), int(ctx), h, kvh, d)
    scales = {}
    if args.kv_cache_dtype == "fp8":
        (k, ks), (v, vs) = fp8_cache(k), fp8_cache(v)
        scales = {"k_scales": ks, "v_scales": vs}
        if fp8_v_dim_major_requested():
            v = to_v_dim_major(v)
    for _ in range(args.runs):
        paged_attention_decode_triton(q, k, v, bt, sl, d ** -0.5, **scales)
    torch.cuda.synchronize()
    print(f"ran {args.runs} decodes: {args.case}, {args.kv_cache_dtype}")


if __name__ == "__main__":
    main()
