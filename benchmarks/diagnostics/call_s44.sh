#!/usr/bin/env bash
# 2026-12-03 (carry .commit and .whl; ~4 min). Issue 17's decode-kernel figures under the
# defaults of this commit with `pagedrt bench attention`'s back-to-back timing beside its
# one-call-per-replay one (fp8kv_h200.sh's attention step), and the FP8 GPU decode tests
# (every FP8 decode launch against the reference, compiled; the engine through CUDA graphs).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests fp8 200 tests/gpu/test_fp8_kv_gpu.py -k "decode_launches or engine_on_gpu"
OUT="$out/r/fp8kv" FP8KV_STEPS=attention bash benchmarks/fp8kv_h200.sh | tail -8
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
