#!/usr/bin/env bash
# 2026-12-04 03:50 UTC (carry .commit and .whl; ~7 min). Issue 16: split-K in the decode
# matmul. Its GPU tests (split-K in a replayed graph, the engine's tokens with a split config
# forced), then benchmarks/matmul_tune.py --grid split (98 configs, split 1-8) against cuBLAS
# at Qwen2-0.5B's (8-256 rows) and Llama-3-8B's (8, 64, 256 rows) decode GEMMs.
set -u
. benchmarks/diagnostics/call_common.sh
for i in 0 1 2 3 4 5 6 7; do
  timeout 220 python3 benchmarks/matmul_tune.py --grid split --out "$out/r/shard$i" --shard $i/8 \
    --rows 8,16,256 > "$out/r/shard$i.log" 2>&1 &
done
gpu_tests matmul 200 tests/gpu/test_matmul_gpu.py
wait
echo "compiled"
timeout 170 python3 benchmarks/matmul_tune.py --grid split --out "$out/r/qwen" --models qwen2-0.5b \
  --rows 8,16,32,64,128,256 2>&1 | tee "$out/r/qwen.txt" | cut -c1-220
timeout 120 python3 benchmarks/matmul_tune.py --grid split --out "$out/r/llama" --models llama3-8b \
  --rows 8,64,256 2>&1 | tee "$out/r/llama.txt" | cut -c1-220
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
