#!/usr/bin/env bash
# Prepared 2026-12-03 08:00 UTC for the next lease (carry .commit and .whl; ~8 min). The GPU
# tests that have not run since the FP8 decode default became the warp-tile kernel
# (2575b7b) and since the fused-reduce GPU test pinned `_decode_kernel` on both of its paths
# (04dba36): the rest of test_fp8_kv_gpu.py and test_decode_fused_reduce_gpu.py.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests fp8rest 300 tests/gpu/test_fp8_kv_gpu.py -k \
  "not (decode_launches or attention_on_gpu_matches or engine_on_gpu or prefill_reads)"
gpu_tests fused 240 tests/gpu/test_decode_fused_reduce_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
