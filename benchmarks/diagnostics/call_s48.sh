#!/usr/bin/env bash
# 2026-12-03 18:05 UTC (carry .commit, .whl and .base = `git archive 9dd2f55 pagedrt`; ~8 min).
# The 16-bit warp-tile default and the blocked reduce end to end against the commit before
# them, alternated in one call (paired_h200.sh: Qwen2-0.5B 256 x 512/128 twice each, ABBA,
# and batch-1 latency once each); then the FP8 GPU decode and engine tests (timed out at
# 150 s in call_s47).
set -u
. benchmarks/diagnostics/call_common.sh
BASE=.base BASE_COMMIT=9dd2f55 REPEATS=2 NANO_REPEATS=0 OUT="$out/r/paired" \
  bash benchmarks/paired_h200.sh 2>&1 | tail -8
gpu_tests fp8 220 tests/gpu/test_fp8_kv_gpu.py -k "decode_launches or engine_on_gpu"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
