#!/usr/bin/env bash
# For the next lease, after call_s69.sh (carry .commit and .whl; ~9 min). Issue 16, batch 1:
# latency with PAGEDRT_L2_PREFETCH=1 / 0, then PAGEDRT_DECODE_PRE_WAIT=1 / 0, each in ABBA
# order on a GPU nobody else uses; the latter's GPU test first (tests/gpu/test_decode_gpu.py -k
# before_the_wait).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_decode_pre 120 tests/gpu/test_decode_gpu.py -k before_the_wait
switch_runs latency PAGEDRT_L2_PREFETCH l2a:1 nol2a:0 nol2b:0 l2b:1
switch_runs latency PAGEDRT_DECODE_PRE_WAIT prea:1 nopa:0 nopb:0 preb:1
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
