#!/usr/bin/env bash
# PAGEDRT_DECODE_PRE_WAIT (carry .commit and .whl; <= 10 min, pieces capped, results kept as
# they finish): its GPU test, then issue 17's FP8 decode figures with it on / off, then
# Qwen2-0.5B batch-1 latency with it 1 / 0 / 0 / 1 (issue 16).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_decode_pre 90 tests/gpu/test_decode_gpu.py -k before_the_wait
pkill -f pytest; sleep 1
for n in a:1 b:0; do
  IFS=: read -r name v <<< "$n"
  PAGEDRT_DECODE_PRE_WAIT=$v timeout 100 python3 -m pagedrt.entrypoints.cli bench attention \
    --kv-cache-dtype fp8 --decode-shapes \
    llama3-8b:64:4096,llama3-8b:8:32768,qwen2-0.5b:64:4096,qwen2-0.5b:16:16384 \
    --out "$out/r/att_pre$v$name" > "$out/r/att_pre$v$name.txt" 2>&1
  echo "att_pre$v$name status $?"; grep -iE "qwen2|llama3" "$out/r/att_pre$v$name.txt" | head -8
done
switch_runs latency PAGEDRT_DECODE_PRE_WAIT prea:1 nopa:0 nopb:0 preb:1
