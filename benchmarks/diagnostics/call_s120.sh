#!/usr/bin/env bash
# A split decode's shortest partition (PAGEDRT_DECODE_MIN_PART, issue 16): its GPU tests, then
# Qwen2-0.5B batch-1 latency at floors 0 (one tile, today), 64, 128 and 256 in ABAB order, the
# 64 x 512/128 workload with batches 8 and 32 at floors 0 / 128 / 256, and the batch-8 decode
# timeline at 0 and 128 (the attention and its reduce took 168 of 926 us a step at batch 8 in
# call_s119). One GPU; carry .commit, .whl and .tcache; ~7 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests tests 200 tests/gpu/test_decode_min_partition_gpu.py tests/gpu/test_decode_gpu.py
lat() {  # name, floor, cap
  local t0=$SECONDS
  PAGEDRT_DECODE_MIN_PART=$2 timeout "$3" python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 --name "lat_$1" \
    --out "$out/r" > "$out/r/lat_$1.txt" 2>&1
  echo "lat_$1 (PAGEDRT_DECODE_MIN_PART=$2) status $? in $((SECONDS - t0))s: $(grep -E \
    "batch1" "$out/r/lat_$1.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
}
lat mp0a 0 150
lat mp128a 128 70
lat mp256a 256 70
lat mp64a 64 70
lat mp0b 0 70
lat mp128b 128 70
lat mp256b 256 70
lat mp64b 64 70
sw() {  # name, floor, cap
  local t0=$SECONDS
  PAGEDRT_DECODE_MIN_PART=$2 timeout "$3" python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --num-requests 64 --max-num-seqs 64 --batch-sizes 8,32 --repeats 2 \
    --skip-step-split --name "sw_$1" --out "$out/r" > "$out/r/sw_$1.txt" 2>&1
  echo "sw_$1 (PAGEDRT_DECODE_MIN_PART=$2) status $? in $((SECONDS - t0))s: $(grep -E \
    "^pagedrt +qwen" "$out/r/sw_$1.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
sw mp0 0 120
sw mp128 128 80
sw mp256 256 80
sw mp0b 0 80
for mp in 0 128; do
  [ $SECONDS -lt 500 ] || break
  PAGEDRT_DECODE_MIN_PART=$mp timeout 80 python3 benchmarks/diagnostics/decode_timeline.py \
    --batch 8 --context 512 --steps 32 --out "$out/r/tl_b8_mp$mp.json" > "$out/r/tl_b8_mp$mp.txt" 2>&1
  echo "tl_b8 mp$mp status $?"; grep -E "^wall|^batch|_decode|^total" "$out/r/tl_b8_mp$mp.txt" | head -6
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
