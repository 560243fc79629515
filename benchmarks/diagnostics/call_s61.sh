#!/usr/bin/env bash
# Issue 16 (carry .commit and .whl; ~5 min): RoPE's operands loaded before the K loop in both
# QKV + RoPE kernels. Their GPU tests (1-4 rows and 8-128 rows), the decode graphs of cuBLAS /
# the path without the RoPE epilogue / with it (matmul_graphs.py --variants off,norope,on),
# and batch-1 latency at ctx 512 and 4,096 (three repeats).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests rope 120 tests/gpu/test_matmul_gpu.py tests/gpu/test_fused_small_batch_gpu.py -k "rope"
timeout 160 python3 benchmarks/diagnostics/matmul_graphs.py --variants off,norope,on \
  --batch-sizes 8,16,32,64,96,128 > "$out/r/graphs.txt" 2>&1
echo "graphs status $?"; grep -E "qkv_rope|took" "$out/r/graphs.txt" | head -12
grep -v "^  (" "$out/r/graphs.txt" | tail -7
timeout 80 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat --out "$out/r" > "$out/r/lat.txt" 2>&1
echo "lat status $?"; grep -E "^pagedrt" "$out/r/lat.txt" | tail -2
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
