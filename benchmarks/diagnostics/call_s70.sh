#!/usr/bin/env bash
# For the next lease, after call_s69.sh (carry .commit and .whl; ~9 min). Issue 16, batch 1:
# latency with PAGEDRT_L2_PREFETCH=1 / 0, then PAGEDRT_DECODE_PRE_WAIT=1 / 0, each in ABBA
# order on a GPU nobody else uses; the latter's GPU test first (tests/gpu/test_decode_gpu.py -k
# before_the_wait).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_decode_pre 120 tests/gpu/test_decode_gpu.py -k before_the_wait
for n in l2a:1 nol2a:0 nol2b:0 l2b:1; do
  IFS=: read -r name v <<< "$n"
  PAGEDRT_L2_PREFETCH=$v timeout 90 python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 --name "lat_$name" \
    --out "$out/r" > "$out/r/lat_$name.txt" 2>&1
  echo "lat_$name status $?"; grep -E "batch1" "$out/r/lat_$name.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' '; echo
done
for n in prea:1 nopa:0 nopb:0 preb:1; do  # the decode kernel's lengths and block ids
  IFS=: read -r name v <<< "$n"
  PAGEDRT_DECODE_PRE_WAIT=$v timeout 90 python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 --name "lat_$name" \
    --out "$out/r" > "$out/r/lat_$name.txt" 2>&1
  echo "lat_$name status $?"; grep -E "batch1" "$out/r/lat_$name.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' '; echo
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
