#!/usr/bin/env bash
# The last of a session's device time, useful on either card (carry .commit, .whl and .tcache;
# at most ~4 min): on an H200, issue 16's batch-1 rows as call_s132.sh (`bench latency
# --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3`, then
# PAGEDRT_SAMPLE_SPLIT=0 as the peer); on another card, the GPU tests of the step's host-side
# inputs and sampling at HEAD (graph inputs, the sampling kernels, PDL), three shards.
# Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  latency_env lat_split1 150 ""
  [ $SECONDS -lt 170 ] && latency_env lat_split0 50 "PAGEDRT_SAMPLE_SPLIT=0"
else
  gpu_tests_sharded gpu 200 3 tests/gpu/test_graph_inputs_gpu.py \
    tests/gpu/test_sample_triton_gpu.py tests/gpu/test_pdl_gpu.py
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
