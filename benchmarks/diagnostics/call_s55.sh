#!/usr/bin/env bash
# 2026-12-04 04:25 UTC (carry .commit and .whl; ~7 min). Issue 16: gate/up with SwiGLU's
# activation in the decode matmul's epilogue. GPU tests, then benchmarks/matmul_tune.py
# --grid silu --ops gate_up_silu (against cuBLAS + the activation kernel), then the decode
# graphs with the path on and off (benchmarks/diagnostics/matmul_graphs.py: split-K down
# projections, the fused activation, 8-128 rows).
set -u
. benchmarks/diagnostics/call_common.sh
for i in 0 1 2 3 4 5 6 7; do
  timeout 200 python3 benchmarks/matmul_tune.py --grid silu --ops gate_up_silu \
    --out "$out/r/shard$i" --shard $i/8 --rows 8,128 > "$out/r/shard$i.log" 2>&1 &
done
gpu_tests matmul 200 tests/gpu/test_matmul_gpu.py
wait
echo "compiled"
timeout 120 python3 benchmarks/matmul_tune.py --grid silu --ops gate_up_silu --out "$out/r/silu" \
  --rows 8,16,32,64,96,128 2>&1 | tee "$out/r/silu.txt" | cut -c1-220
timeout 240 python3 benchmarks/diagnostics/matmul_graphs.py --batch-sizes 8,16,32,64,96,128 \
  > "$out/r/graphs.txt" 2>&1
echo "graphs status $?"; grep -v "^  (" "$out/r/graphs.txt" | tail -12; grep -c silu_mul "$out/r/graphs.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
