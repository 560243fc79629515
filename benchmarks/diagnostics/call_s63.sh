#!/usr/bin/env bash
# For the next lease (carry .commit and .whl; ~3 min). Issue 16, batch 1: why the start-up
# timing keeps the RMSNorm before gate/up and SwiGLU's activation before down as kernels of
# their own at Qwen2-0.5B's batch 1 (benchmarks/results/RUNS.md, runs of 2026-12-04 06:15): every
# fused candidate against the chain, and which ones the timing tries (prologue_times.py).
set -u
. benchmarks/diagnostics/call_common.sh
timeout 300 python3 benchmarks/diagnostics/prologue_times.py --rows 1,2,4 \
  > "$out/r/prologue_times.txt" 2>&1
echo "prologue_times status $?"; cat "$out/r/prologue_times.txt" | tail -20
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
