#!/usr/bin/env bash
# Issue 16's Qwen2-0.5B status rows if an H200 came, nothing on another GPU (carry .commit,
# .whl and .tcache; under 7 min on an H200): batch-1 latency first (the target nearest its
# figure), then 256 x 512/128 with --repeats 2 and nano-vllm's workload, one process each.
# Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: nothing run"; exit 0
fi
latency_run head 120
latency_run head2 60
status_bench main 150 --repeats 2
status_bench nano 100 --workload nanovllm --repeats 2
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
