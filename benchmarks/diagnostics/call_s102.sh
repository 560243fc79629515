#!/usr/bin/env bash
# PAGEDRT_MATMUL_FUSED_MAX_ROWS 128 (the default) against 256 in one call, the batch sweep of
# record each way (`sweep`: `pagedrt bench throughput --preset qwen2-0.5b --skip-step-split
# --batch-sizes 8,32,64,128 --repeats 3`, capped at 200 s), then the GPU tests of the fused
# SwiGLU and QKV + RoPE kernels (now with 256 rows) if the call has time left. Carry .commit, .whl and a Triton cache as .tcache/
# (~8 min). One summary line per run; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
sweep rows128 PAGEDRT_MATMUL_FUSED_MAX_ROWS=128
sweep rows256 PAGEDRT_MATMUL_FUSED_MAX_ROWS=256
# the fused SwiGLU and QKV + RoPE kernels' GPU tests, now with 256 rows, in what time is left
if [ "$SECONDS" -lt 430 ]; then
  gpu_tests matmul256 $((500 - SECONDS)) tests/gpu/test_matmul_gpu.py -k "silu_mul_matches or qkv_rope_matches"
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
