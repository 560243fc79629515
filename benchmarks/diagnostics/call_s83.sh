#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit and .whl; the session's last ~9 min): HEAD's start-up
# timing in rounds with the PDL lead: batch-1 latency at ctx 512 / 4,096 from three fresh
# engines (each makes its own choices, printed: are they stable now), then the whole
# tests/gpu/test_fused_small_batch_gpu.py (the combine-in-O engine test did not finish in
# call_s82).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_run 1 250
latency_run 2 80
latency_run 3 80
gpu_tests gpu_fused 130 tests/gpu/test_fused_small_batch_gpu.py
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
