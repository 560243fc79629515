#!/usr/bin/env bash
# The decode attention's early reads as they now stand (issue 16; `4defdad` onward: the tile
# loop in its old order, early reads over 16-bit caches by default), on one GPU (carry
# .commit, .whl and .tcache; ~7 min): the GPU test that writes the newest tokens late (bf16 and
# FP8), then batch-1 latency with PAGEDRT_DECODE_EARLY=1 against 0 in ABBA order (bf16 cache),
# then the same over an FP8 cache with PAGEDRT_DECODE_EARLY=all against 1 (FP8's early reads,
# unmeasured so far), and 64 x 512/128 with batches 8 and 32, =1 against =0.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
t0=$SECONDS
timeout 120 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
  tests/gpu/test_pdl_early_reads_gpu.py > "$out/r/tests.txt" 2>&1
echo "early-read GPU tests status $? in $((SECONDS - t0))s: $(tail -1 "$out/r/tests.txt")"
lat() {  # name, PAGEDRT_DECODE_EARLY, extra bench latency arguments
  local t0=$SECONDS name=$1 early=$2
  shift 2
  PAGEDRT_DECODE_EARLY=$early timeout 70 python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 --name "lat_$name" \
    --out "$out/r" "$@" > "$out/r/lat_$name.txt" 2>&1
  echo "lat_$name (PAGEDRT_DECODE_EARLY=$early $*) status $? in $((SECONDS - t0))s: $(grep -E \
    "batch1" "$out/r/lat_$name.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
}
lat on1 1
lat off1 0
lat off2 0
lat on2 1
lat fp8_all1 all --kv-cache-dtype fp8
lat fp8_16bit1 1 --kv-cache-dtype fp8
lat fp8_16bit2 1 --kv-cache-dtype fp8
lat fp8_all2 all --kv-cache-dtype fp8
sw() {  # name, PAGEDRT_DECODE_EARLY
  local t0=$SECONDS
  PAGEDRT_DECODE_EARLY=$2 timeout 85 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --num-requests 64 --max-num-seqs 64 --batch-sizes 8,32 --repeats 2 \
    --skip-step-split --name "sw_$1" --out "$out/r" > "$out/r/sw_$1.txt" 2>&1
  echo "sw_$1 (PAGEDRT_DECODE_EARLY=$2) status $? in $((SECONDS - t0))s: $(grep -E \
    "^pagedrt +qwen" "$out/r/sw_$1.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
sw on 1
sw off 0
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
