#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit and .whl; ~9 min): call_s84 less its PDL-lead run, plus the
# in-step timing's GPU test. Batch-1 latency at ctx 512 / 4,096 from fresh engines, the default
# start-up timing and the in-step timing (PAGEDRT_STEP_TIMING=1) alternating (the first run pays
# the compiles), each run's 1-row choices printed; then test_engine_tokens_with_the_in_step_timing;
# then the Triton cache saved for the next call (save_triton_cache).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_run default1 240 ""
latency_run step1 90 PAGEDRT_STEP_TIMING=1
latency_run default2 75 ""
latency_run step2 90 PAGEDRT_STEP_TIMING=1
gpu_tests gpu_step_timing 100 tests/gpu/test_fused_small_batch_gpu.py -k in_step_timing
rm -f "$out"/r/*.png
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
