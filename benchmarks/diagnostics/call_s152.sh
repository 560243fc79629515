#!/usr/bin/env bash
# A short call for the session's last ~450 s of device time (carry .commit, .whl and .tcache):
# on an H200, issue 16's closest row, batch-1 latency (ctx 512 / 4,096; with FULL=1 also 256 x
# 512/128; the first process times the kernel configs for the H200 and files them); on an H100, the
# decode attention's GPU tests after the batch-1 override's removal. Results in $OUT/r as
# single files (no archive, few files: the transfer left out the many files of call_s151).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
if grep -q H200 "$out/r/gpu.txt"; then
  latency_run head 170
  [ "${FULL:-0}" = 1 ] && status_bench main 200
else
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode_gpu.py \
    > "$out/r/decode_gpu.txt" 2>&1
  echo "decode GPU tests status $?: $(tail -1 "$out/r/decode_gpu.txt")"
fi
