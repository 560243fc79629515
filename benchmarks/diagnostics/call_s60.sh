#!/usr/bin/env bash
# Issue 16 (carry .commit and .whl; ~6 min): RoPE and the K/V write in the epilogue of the
# 8-128-row QKV matmul (pagedrt/ops/matmul_rope_triton.py). Its GPU tests with the rest of the
# decode matmul's, the decode graphs of cuBLAS / the path without it / the path with it
# (matmul_graphs.py --variants off,norope,on), then Qwen2-0.5B 512/128 at batches 8-128 with
# PAGEDRT_FUSED_ROPE on and off (on, off, off, on).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests matmul 200 tests/gpu/test_matmul_gpu.py
timeout 200 python3 benchmarks/diagnostics/matmul_graphs.py --variants off,norope,on \
  --batch-sizes 8,16,32,64,96,128 > "$out/r/graphs.txt" 2>&1
echo "graphs status $?"; grep -v "^  (" "$out/r/graphs.txt" | tail -8
thr() {  # name, PAGEDRT_FUSED_ROPE
  PAGEDRT_FUSED_ROPE=$2 timeout 90 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 --name "$1" --out "$out/r" \
    > "$out/r/$1.txt" 2>&1
  echo "$1 status $?"; grep -E "^pagedrt +qwen" "$out/r/$1.txt" | tr -s ' ' | cut -d' ' -f3,4 | tr '\n' ' '; echo
}
thr rope1 1; thr plain1 0; thr plain2 0; thr rope2 1
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
