#!/usr/bin/env bash
# Auto multi-step (the default since f0fd17e) against one pass on the next H200, after
# call_s158.sh (carry .commit, .whl and .tcache with call_s158's cache parts; ~9 min): batch-1
# latency (Qwen2-0.5B preset, ctx 512 / 4,096, graphs on, 3 repeats) with the default and with
# --num-scheduler-steps 1 alternated (ABAB; the first process times the kernel configs), then
# the 256 x 512/128 run with the batch sweep at 8, 32 and 64 rows, default and one pass
# alternated, while time is left. Results in $OUT/r; the summary lines last.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
{
  latency_env lat_auto_a 220 ""
  latency_env lat_k1_a 60 "" --num-scheduler-steps 1
  latency_env lat_auto_b 60 ""
  latency_env lat_k1_b 60 "" --num-scheduler-steps 1
  cap=200  # (the first throughput process times the 8-256-row configs; the others read them)
  for run in auto_a k1_a auto_b k1_b; do
    left=$((570 - SECONDS))
    [ "$cap" -gt "$left" ] && cap=$left
    if [ "$cap" -lt 70 ]; then echo "sw_$run skipped: ${left}s left"; continue; fi
    steps=""; [ "${run%_*}" = k1 ] && steps="--num-scheduler-steps 1"
    bench_env "sw_$run" "$cap" "" --batch-sizes 8,32,64 --repeats 2 $steps
    cap=90
  done
} 2>&1 | tee "$out/r/summary.txt"
burst_summary "$out"/r/sw_*.json
