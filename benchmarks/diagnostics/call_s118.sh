#!/usr/bin/env bash
# call_s117.sh's runs with caps for a tree whose timed choices are not yet on disk (the first
# latency run of each cache dtype times them, ~80 s; PAGEDRT_DECODE_EARLY is no longer in the
# config cache's fingerprint, so its A/B runs share those choices), plus the batch-1 host
# profile (batch1_steps.py --profile: the lent host's step function by function). One GPU;
# carry .commit, .whl and .tcache; ~9 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
t0=$SECONDS
timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
  tests/gpu/test_pdl_early_reads_gpu.py > "$out/r/tests.txt" 2>&1
echo "early-read GPU tests status $? in $((SECONDS - t0))s: $(tail -1 "$out/r/tests.txt")"
lat() {  # name, PAGEDRT_DECODE_EARLY, cap, extra bench latency arguments
  local t0=$SECONDS name=$1 early=$2 cap=$3
  shift 3
  PAGEDRT_DECODE_EARLY=$early timeout "$cap" python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 --name "lat_$name" \
    --out "$out/r" "$@" > "$out/r/lat_$name.txt" 2>&1
  echo "lat_$name (PAGEDRT_DECODE_EARLY=$early $*) status $? in $((SECONDS - t0))s: $(grep -E \
    "batch1" "$out/r/lat_$name.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
}
lat on1 1 170
lat off1 0 70
lat off2 0 70
lat on2 1 70
lat fp8_all1 all 150 --kv-cache-dtype fp8
lat fp8_16bit1 1 70 --kv-cache-dtype fp8
lat fp8_16bit2 1 70 --kv-cache-dtype fp8
lat fp8_all2 all 70 --kv-cache-dtype fp8
t1=$SECONDS
timeout 90 python3 benchmarks/diagnostics/batch1_steps.py --runs 3 --steps 128 \
  --profile "$out/r/b1_profile.txt" > "$out/r/b1_steps.txt" 2>&1
echo "batch1_steps status $? in $((SECONDS - t1))s"; grep -E "^run|ms/step|^profiled" "$out/r/b1_steps.txt" | head -12
sw() {  # name, PAGEDRT_DECODE_EARLY, cap
  local t0=$SECONDS
  PAGEDRT_DECODE_EARLY=$2 timeout "$3" python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --num-requests 64 --max-num-seqs 64 --batch-sizes 8,32 --repeats 2 \
    --skip-step-split --name "sw_$1" --out "$out/r" > "$out/r/sw_$1.txt" 2>&1
  echo "sw_$1 (PAGEDRT_DECODE_EARLY=$2) status $? in $((SECONDS - t0))s: $(grep -E \
    "^pagedrt +qwen" "$out/r/sw_$1.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
[ $SECONDS -lt 420 ] && sw on 1 100
[ $SECONDS -lt 480 ] && sw off 0 80
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
