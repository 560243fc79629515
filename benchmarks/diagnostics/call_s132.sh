#!/usr/bin/env bash
# The closest of issue 16's H200 targets alone, for a lease with little device time left
# (built 2026-12-06; carry .commit, .whl and .tcache; at most ~4 min): Qwen2-0.5B batch-1
# decode at ctx 512 / 4,096 (`bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs
# on --repeats 3`; targets 0.6 / 0.65 ms, last 0.608 / 0.651 on 2026-12-04), the first process
# timing the kernel configs, then PAGEDRT_SAMPLE_SPLIT=0 as the peer where time is left.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_env lat_split1 150 ""
[ $SECONDS -lt 170 ] && latency_env lat_split0 50 "PAGEDRT_SAMPLE_SPLIT=0"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
