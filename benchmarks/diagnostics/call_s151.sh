#!/usr/bin/env bash
# This session's first call (carry .commit, .whl and .tcache; under 10 min): on an H200,
# issue 16's Qwen2-0.5B status rows (call_s112.sh: 256 x 512/128, the batch sweep of record,
# batch-1 latency, nano-vllm's workload; the last H200 figures are of 2026-12-04); on an H100,
# call_s149.sh (batch-1 decode attention as one many-warp program per KV head: the kernel
# sweep, then whole steps with PAGEDRT_DECODE_BATCH1_CONFIG), which the next call on a warm
# H200 runs instead. Everything in $OUT/results.tgz.
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash benchmarks/diagnostics/call_s112.sh
else
  bash benchmarks/diagnostics/call_s149.sh
fi
