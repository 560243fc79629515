#!/usr/bin/env bash
# call_s154.sh cut to fit the session's last ~450 s of device time (carry .commit, .whl and
# .tcache): batch-1 latency with --num-scheduler-steps 1 (the peer) and 8, alternated (ABAB),
# then 4, then the multi-step GPU tests. Results in $OUT/r; the summary lines last.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
{
  latency_env lat_k1a 150 "" --num-scheduler-steps 1
  latency_env lat_k8a 60 "" --num-scheduler-steps 8
  latency_env lat_k1b 60 "" --num-scheduler-steps 1
  latency_env lat_k8b 60 "" --num-scheduler-steps 8
  latency_env lat_k4 60 "" --num-scheduler-steps 4
  gpu_tests multi_step_gpu 120 tests/gpu/test_multi_step_gpu.py
} 2>&1 | tee "$out/r/summary.txt"
