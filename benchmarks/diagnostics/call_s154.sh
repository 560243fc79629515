#!/usr/bin/env bash
# Multi-step decode at batch 1 (carry .commit, .whl and .tcache): `pagedrt bench latency`
# (Qwen2-0.5B preset, ctx 512 / 4,096, graphs on, 3 repeats), one process each, with
# --num-scheduler-steps 1 (the peer: one pass a step) and 4 / 8 / 16, alternated; then the
# multi-step and staged-input GPU tests, and with FULL=1 nano-vllm's workload with 1 and 8. Results in $OUT/r
# as single files; the summary lines last.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
latency_env lat_k1a 170 "" --num-scheduler-steps 1 | tee -a "$out/r/summary.txt"
latency_env lat_k8a 90 "" --num-scheduler-steps 8 | tee -a "$out/r/summary.txt"
latency_env lat_k1b 90 "" --num-scheduler-steps 1 | tee -a "$out/r/summary.txt"
latency_env lat_k8b 90 "" --num-scheduler-steps 8 | tee -a "$out/r/summary.txt"
latency_env lat_k4 90 "" --num-scheduler-steps 4 | tee -a "$out/r/summary.txt"
latency_env lat_k16 90 "" --num-scheduler-steps 16 | tee -a "$out/r/summary.txt"
gpu_tests multi_step_gpu 150 tests/gpu/test_multi_step_gpu.py tests/gpu/test_graph_inputs_gpu.py | tee -a "$out/r/summary.txt"
if [ "${FULL:-0}" = 1 ]; then
  bench_env nano_k1 150 "" --workload nanovllm --num-scheduler-steps 1 | tee -a "$out/r/summary.txt"
  bench_env nano_k8 150 "" --workload nanovllm --num-scheduler-steps 8 | tee -a "$out/r/summary.txt"
fi
echo "== summary"; cat "$out/r/summary.txt"
