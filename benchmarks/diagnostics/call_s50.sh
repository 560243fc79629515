#!/usr/bin/env bash
# 2026-12-03 23:55 UTC (carry .commit and .whl; ~8 min). Issue 16: the decode matmul
# (pagedrt/ops/matmul_triton.py) against cuBLAS at Qwen2-0.5B's and Llama-3-8B's decode GEMMs
# (benchmarks/matmul_tune.py: 84 tile configs compiled in 8 parallel shards, then timed).
set -u
. benchmarks/diagnostics/call_common.sh
for i in 0 1 2 3 4 5 6 7; do
  timeout 200 python3 benchmarks/matmul_tune.py --out "$out/r/shard$i" --shard $i/8 \
    --rows 8,16,256 > "$out/r/shard$i.log" 2>&1 &
done
wait
echo "compiled"
timeout 170 python3 benchmarks/matmul_tune.py --out "$out/r/qwen" --models qwen2-0.5b \
  --rows 8,16,32,64,128,256 2>&1 | tee "$out/r/qwen.txt" | cut -c1-200
timeout 150 python3 benchmarks/matmul_tune.py --out "$out/r/llama" --models llama3-8b \
  --rows 8,64,256 2>&1 | tee "$out/r/llama.txt" | cut -c1-200
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
