#!/usr/bin/env bash
# Decode attention over rows of unequal contexts (issue 16, nano-vllm's workload): the order in
# which the programs take the rows, timed by benchmarks/diagnostics/decode_row_order.py over a
# bf16 and an FP8 cache of Qwen2-0.5B's heads (carry .commit, .whl and .tcache; ~3 min).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
t0=$SECONDS
timeout 300 python3 benchmarks/diagnostics/decode_row_order.py --out "$out/r/bf16" \
  > "$out/r/bf16.txt" 2>&1; echo "bf16 status $? in $((SECONDS - t0))s"
t0=$SECONDS
timeout 150 python3 benchmarks/diagnostics/decode_row_order.py --out "$out/r/fp8" \
  --kv-cache-dtype fp8 --rows 256,128 --ranges 100:2048 --nanovllm-steps 128 \
  > "$out/r/fp8.txt" 2>&1; echo "fp8 status $? in $((SECONDS - t0))s"
grep -v "^{" "$out/r/bf16.txt" | tail -20
grep -v "^{" "$out/r/fp8.txt" | tail -8
