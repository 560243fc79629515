#!/usr/bin/env bash
# The session's first call (carry .commit, .whl and .tcache): on an H200, issue 16's batch-1
# row (ctx 512 / 4,096), never measured on an H200 since the staged graph inputs became the
# default (2026-12-05 14:58), then the batch-1 host by phase (batch1_steps.py), then with
# FULL=1 the 256 x 512/128 status row; on an H100, the decode attention's GPU tests. Results
# in $OUT/r as single files.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
if grep -q H200 "$out/r/gpu.txt"; then
  latency_run head 170
  t1=$SECONDS
  timeout 90 python3 benchmarks/diagnostics/batch1_steps.py --runs 2 --steps 128 \
    > "$out/r/b1_steps.txt" 2>&1
  echo "batch1_steps status $? in $((SECONDS - t1))s"
  grep -E "^run|ms/step|phase" "$out/r/b1_steps.txt" | head -12
  latency_run head2 120
  [ "${FULL:-0}" = 1 ] && status_bench main 200
else
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode_gpu.py \
    > "$out/r/decode_gpu.txt" 2>&1
  echo "decode GPU tests status $?: $(tail -1 "$out/r/decode_gpu.txt")"
fi
