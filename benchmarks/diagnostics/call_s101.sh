#!/usr/bin/env bash
# Second call after call_s100.sh (same warm machine, or carry its Triton cache as .tcache/;
# carry .commit and .whl; ~9 min): PAGEDRT_MATMUL_PRE_NORM off / on / on / off, then
# PAGEDRT_MATMUL_FUSED_MAX_ROWS 128 / 256, each run one `pagedrt bench throughput --preset
# qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128` process (switch_runs throughput:
# 256 x 512/128 and batches 8-128; the 256-row figure is the one FUSED_MAX_ROWS can move).
# One summary line per run; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
switch_runs throughput PAGEDRT_MATMUL_PRE_NORM off:0 on:1 on2:1 off2:0
switch_runs throughput PAGEDRT_MATMUL_FUSED_MAX_ROWS rows128:128 rows256:256
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
