#!/usr/bin/env bash
# Issue 16, batches 8-256, for the next lease after call_s84 (carry .commit, .whl and the
# .tcache it saved; ~9 min): the PDL lead also changes the 8-128-row matmul's choices, never
# measured: the batch sweep of record (Qwen2-0.5B 512/128 at 256 and batches 8-128,
# --repeats 3) with the default timing, then with PAGEDRT_TIMING_LEAD=1; then the whole fused
# small-batch GPU test file (never run whole: capped in s22call6 and s23call3).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
sweep default ""
sweep lead PAGEDRT_TIMING_LEAD=1
gpu_tests gpu_fused 150 tests/gpu/test_fused_small_batch_gpu.py  # with the in-step timing's test
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
