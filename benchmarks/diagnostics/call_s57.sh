#!/usr/bin/env bash
# 2026-12-04 04:45 UTC (carry .commit and .whl; ~3 min). SILU_CONFIGS back to CONFIGS' whole-K
# tiles: the decode graphs on and off (matmul_graphs.py), to compare with call_s55 and s56.
set -u
. benchmarks/diagnostics/call_common.sh
timeout 200 python3 benchmarks/diagnostics/matmul_graphs.py --batch-sizes 8,16,32,64,96,128 \
  > "$out/r/graphs.txt" 2>&1
echo "graphs status $?"; grep -v "^  (" "$out/r/graphs.txt" | tail -8; grep silu "$out/r/graphs.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
