#!/usr/bin/env bash
# Two one-kernel ops for 1-4 decode rows, on either card (carry .commit, .whl and .tcache; at
# most ~8.5 min): the whole MLP (pagedrt/ops/mlp_triton.py) and the attention's combine with
# the O projection (pagedrt/ops/attn_o_triton.py), both opt-in. Batch-1 decode with both
# (PAGEDRT_FUSED_MLP=1 PAGEDRT_FUSED_ATTN_O=1) against the default, ABAB (`bench latency
# --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3`; the first process times
# the kernel configs, the others read them from the config cache, whose fingerprint leaves
# both switches out); then each kernel alone against its chain at Qwen2-0.5B's and
# Llama-3-8B's shapes, 1, 2 and 4 rows (benchmarks/diagnostics/fused_vs_chain.py, timed
# fresh); then their GPU tests, two shards. Each step skipped
# where too little of the call is left. Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
on="PAGEDRT_FUSED_MLP=1 PAGEDRT_FUSED_ATTN_O=1"
latency_env lat_both 170 "$on"
latency_env lat_none 60 ""
latency_env lat_both_b 60 "$on"
latency_env lat_none_b 60 ""
if [ $SECONDS -lt 360 ]; then
  env $on PAGEDRT_CONFIG_CACHE=off timeout 90 python3 benchmarks/diagnostics/fused_vs_chain.py \
    --out "$out/r/fused_vs_chain.json" > "$out/r/fused_vs_chain.txt" 2>&1
  echo "fused_vs_chain status $? at ${SECONDS}s"
  grep -E "rows [0-9]:" "$out/r/fused_vs_chain.txt" | cut -c1-150
fi
left=$((500 - SECONDS))
[ $left -gt 45 ] && gpu_tests_sharded gpu "$left" 2 tests/gpu/test_mlp_gpu.py \
  tests/gpu/test_attn_o_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
