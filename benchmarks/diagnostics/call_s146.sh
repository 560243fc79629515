#!/usr/bin/env bash
# The one-row skinny matmul (591a50d: `_gemv_row_kernel`, and the LM head's 1-4 rows through
# the timed skinny matmul) against the tree before it, on either card (carry .commit, .whl,
# .tcache and .base; ~7 min). Before the call, here:
#   git rev-parse --short HEAD > .commit
#   rm -rf .base && mkdir .base && git archive 9f4b5df pagedrt | tar -x -C .base   # git-ignored
# GPU tests of the kernel (tests/gpu/test_fused_small_batch_gpu.py), then batch-1 decode
# (`pagedrt bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3`) in
# ABBA order, base and this tree, one process each, each process's 1-row choices printed.
# Summary lines last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests fused 150 tests/gpu/test_fused_small_batch_gpu.py
BASE_COMMIT=9f4b5df  # lat_tree (call_common.sh): .base holds its pagedrt/
lat_tree base lat_base_1 110
lat_tree head lat_head_1 110
lat_tree head lat_head_2 90
lat_tree base lat_base_2 90
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
