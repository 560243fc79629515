#!/usr/bin/env bash
# The whole 1-4-row MLP in one kernel (pagedrt/ops/mlp_triton.py), on either card (carry
# .commit, .whl and .tcache; at most ~9.5 min): batch-1 decode with it (the default) against
# PAGEDRT_FUSED_MLP=0, ABAB (`bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs
# on --repeats 3`; the first process times the kernel configs, the others read them from the
# config cache, whose fingerprint leaves the switch out); then the kernel alone against its
# chain at Qwen2-0.5B's and Llama-3-8B's shapes, 1, 2 and 4 rows
# (benchmarks/diagnostics/mlp_fused.py, timed fresh); then its GPU tests and the fused
# small-batch ones, two shards. Each step skipped where too little of the call is left.
# Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_env lat_mlp1 170 ""
latency_env lat_mlp0 70 "PAGEDRT_FUSED_MLP=0"
latency_env lat_mlp1b 70 ""
[ $SECONDS -lt 330 ] && latency_env lat_mlp0b 70 "PAGEDRT_FUSED_MLP=0"
if [ $SECONDS -lt 400 ]; then
  PAGEDRT_CONFIG_CACHE=off timeout 100 python3 benchmarks/diagnostics/mlp_fused.py \
    --out "$out/r/mlp_fused.json" > "$out/r/mlp_fused.txt" 2>&1
  echo "mlp_fused status $? at ${SECONDS}s"; grep -E "rows [0-9]:" "$out/r/mlp_fused.txt" \
    | cut -c1-150
fi
left=$((560 - SECONDS))
[ $left -gt 60 ] && gpu_tests_sharded gpu "$left" 2 tests/gpu/test_mlp_gpu.py \
  tests/gpu/test_fused_small_batch_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
