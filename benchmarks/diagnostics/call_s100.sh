#!/usr/bin/env bash
# PAGEDRT_MATMUL_PRE_NORM (the RMSNorm before the QKV and gate/up projections in their
# kernels' prologue, 8-128 rows; docs/design.md, "Decode matmuls (8 to 128 rows)"), written
# 2026-12-05 and checked only under the interpreter and Triton 3.6's compiler: its GPU tests
# (the three kernels against the norm kernel and the kernel without the norm in bf16, the
# engine's tokens with every op forced through it), then the batch sweep off / on / on / off
# (switch_runs throughput: Qwen2-0.5B 512/128 at batches 8-128 and 256, one process each),
# then PAGEDRT_MATMUL_FUSED_MAX_ROWS 128 / 256 the same way (the 256-row row is the one it
# can move). Trim to fit a call's 10 minutes if the Triton cache is cold.
# Carry .commit, .whl and .tcache; ~9 min with a warm Triton cache (the sweep's four
# processes each time their tile choices at start-up). Summaries last; everything in
# $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests prenorm_gpu 200 tests/gpu/test_matmul_gpu.py -k "prologue or engine_tokens"
switch_runs throughput PAGEDRT_MATMUL_PRE_NORM off:0 on:1 on2:1 off2:0
# the fused ops at 144-256 rows (PAGEDRT_MATMUL_FUSED_MAX_ROWS), the 256 x 512/128 row of each
switch_runs throughput PAGEDRT_MATMUL_FUSED_MAX_ROWS rows128:128 rows256:256
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
