#!/usr/bin/env bash
# call_s136.sh cut to about 5 min, for the last of a session's device time (carry .commit,
# .whl and .tcache): batch-1 decode with the whole-MLP and attention + O kernels on
# (PAGEDRT_FUSED_MLP=1 PAGEDRT_FUSED_ATTN_O=1) against the default, AB (`bench latency
# --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3`; the second process reads
# the first one's timed choices from the config cache), then the two kernels' GPU tests in two
# shards until 290 s. Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_env lat_both 150 "PAGEDRT_FUSED_MLP=1 PAGEDRT_FUSED_ATTN_O=1"
latency_env lat_none 60 ""
left=$((290 - SECONDS))
[ $left -gt 40 ] && gpu_tests_sharded gpu "$left" 2 tests/gpu/test_mlp_gpu.py \
  tests/gpu/test_attn_o_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
