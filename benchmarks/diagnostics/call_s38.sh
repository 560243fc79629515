#!/usr/bin/env bash
# 2026-12-03 06:40 UTC (carry .commit, .whl, .gguf_parts/p1; then a call carrying p2, then
# call_s39, each within 30 s). call_s36's GPU tests ran out of their 330 s compiling the first
# version of the new launch test (16 passed, none failed); this one compiles a quarter as
# many variants: the warp-tile FP8 default's GPU tests, and the engine through CUDA graphs.
set -u
mkdir -p /tmp/gg && cp .gguf_parts/p1 /tmp/gg/
. benchmarks/diagnostics/call_common.sh
gpu_tests fp8 300 tests/gpu/test_fp8_kv_gpu.py -k \
  "decode_launches or attention_on_gpu_matches or engine_on_gpu or prefill_reads"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
