#!/usr/bin/env bash
# Multi-step decode on the next H200 (carry .commit, .whl and .tcache; ~9 min): batch-1
# latency (Qwen2-0.5B preset, ctx 512 / 4,096, graphs on, 3 repeats) with
# --num-scheduler-steps 1 (the peer) and 8 alternated (ABAB), then nano-vllm's workload with
# 1 and 8 passes (one process each; the second only while the call has time left). Results
# in $OUT/r as single files; the summary lines last.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
{
  latency_env lat_k1a 150 "" --num-scheduler-steps 1
  latency_env lat_k8a 60 "" --num-scheduler-steps 8
  latency_env lat_k1b 60 "" --num-scheduler-steps 1
  latency_env lat_k8b 60 "" --num-scheduler-steps 8
  bench_env nano_k1 150 "" --workload nanovllm --num-scheduler-steps 1
  left=$((560 - SECONDS))
  if [ "$left" -gt 60 ]; then
    bench_env nano_k8 "$left" "" --workload nanovllm --num-scheduler-steps 8
  else
    echo "nano_k8 skipped: ${left}s left"
  fi
} 2>&1 | tee "$out/r/summary.txt"
grep -h "tok/s of each\|decode steps" "$out"/r/nano_k*.txt 2>/dev/null | cut -c1-150
