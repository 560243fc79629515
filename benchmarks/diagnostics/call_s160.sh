#!/usr/bin/env bash
# nano-vllm's workload (issue 16's first target) with auto multi-step, the default since
# f0fd17e, against one pass, on the H200 after call_s159.sh (carry .commit, .whl and .tcache
# with the cache parts of call_s158; ~8 min): `bench throughput --workload nanovllm`, the
# default and --num-scheduler-steps 1 alternated (ABAB), one process each, while time is
# left. Its tail decodes at 32 rows and fewer, where auto bursts. Results in $OUT/r; the
# summary lines last, then each run's passes setting and how many bursts it ran.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
{
  cap=200  # (a first process without the configs in the cache times them)
  for run in auto_a k1_a auto_b k1_b; do
    left=$((560 - SECONDS))
    [ "$cap" -gt "$left" ] && cap=$left
    if [ "$cap" -lt 60 ]; then echo "nv_$run skipped: ${left}s left"; continue; fi
    steps=""; [ "${run%_*}" = k1 ] && steps="--num-scheduler-steps 1"
    bench_env "nv_$run" "$cap" "" --workload nanovllm $steps
    grep -h "decode steps\|multi-step decode" "$out/r/nv_$run.txt" | cut -c1-150
    cap=100
  done
} 2>&1 | tee "$out/r/summary.txt"
burst_summary "$out"/r/nv_*.json
