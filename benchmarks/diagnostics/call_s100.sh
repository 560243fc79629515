#!/usr/bin/env bash
# First call of a lease for PAGEDRT_MATMUL_PRE_NORM (the RMSNorm before the QKV and gate/up
# projections in their kernels' prologue; docs/design.md, "Decode matmuls (8 to 128 rows)")
# and PAGEDRT_MATMUL_FUSED_MAX_ROWS (the fused ops at 144-256 rows), written 2026-12-05 and
# checked only under the interpreter and Triton 3.6's compiler (carry .commit and .whl, and
# .tcache if there is one; ~8 min on a fresh machine): prenorm_check.py (the three prologue
# kernels against the norm kernel + the kernel without the norm in bf16, and 24 layers of each
# timed both ways in a CUDA graph at 8-128 rows), then their GPU tests (bf16 kernels at
# Qwen2-0.5B / Llama-3-8B shapes and 8-256 rows; the engine's tokens with every op forced
# through them), then the Triton cache back as $OUT/tc.txz.NN for call_s101.sh. Summaries
# last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
timeout 150 python3 -u benchmarks/diagnostics/prenorm_check.py --rows 8,32,64,128 \
  > "$out/r/prenorm_check.txt" 2>&1
echo "== prenorm_check (status $?)"; tail -12 "$out/r/prenorm_check.txt" | cut -c1-170
gpu_tests prenorm_gpu 240 tests/gpu/test_matmul_gpu.py -k "prologue or engine_tokens"
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
