#!/usr/bin/env bash
# The next session's first call (carry .commit, .whl and .tcache; under 10 min): on an H200,
# issue 16's Qwen2-0.5B status rows first (batch-1 latency, 256 x 512/128 with --repeats 2,
# one process each; nano-vllm's workload in a call of its own); on either card then call_s149.sh
# (batch-1 decode attention as one many-warp program per KV head: the kernel sweep, then whole
# steps with PAGEDRT_DECODE_BATCH1_CONFIG). Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  latency_run head 120
  status_bench main 150 --repeats 2
fi
bash benchmarks/diagnostics/call_s149.sh
