#!/usr/bin/env bash
# The H200 status rows closest to issue 16's targets, in one call (built 2026-12-06 after the
# split sampling, unmeasured on an H200; carry .commit, .whl and .tcache; at most ~9.5 min):
# Qwen2-0.5B batch-1 decode at ctx 512 / 4,096 (`bench latency --preset qwen2-0.5b --contexts
# 512,4096 --graphs on --repeats 3`; targets 0.6 / 0.65 ms, last 0.608 / 0.651) with the
# split sampling against PAGEDRT_SAMPLE_SPLIT=0, ABA (the first process compiles and times
# the kernel configs; the others read them from the config cache), then the Llama-3-8B rows
# (`bench throughput --preset llama3-8b --skip-step-split`, target >= 7,185 tok/s, last
# 6,966; `bench latency --preset llama3-8b --contexts 512,4096 --graphs on --repeats 3`,
# target <= 4.46 ms), each step skipped where too little of the call's time is left. The
# Triton cache back last where time allows ($OUT/tc.txz.NN). Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_env lat_split1 150 ""
latency_env lat_split0 60 "PAGEDRT_SAMPLE_SPLIT=0"
latency_env lat_split1b 60 ""
if [ $SECONDS -lt 300 ]; then
  t0=$SECONDS
  timeout 170 python3 -m pagedrt.entrypoints.cli bench throughput --preset llama3-8b \
    --skip-step-split --name llama --out "$out/r" > "$out/r/llama.txt" 2>&1
  echo "llama status $? in $((SECONDS - t0))s"; grep -E "^pagedrt +llama|start-up|decode steps" \
    "$out/r/llama.txt" | tr -s ' ' | cut -c1-160
fi
if [ $SECONDS -lt 430 ]; then
  t0=$SECONDS
  timeout 110 python3 -m pagedrt.entrypoints.cli bench latency --preset llama3-8b \
    --contexts 512,4096 --graphs on --repeats 3 --name lat_llama --out "$out/r" \
    > "$out/r/lat_llama.txt" 2>&1
  echo "lat_llama status $? in $((SECONDS - t0))s"; grep -E "batch1|start-up" \
    "$out/r/lat_llama.txt" | tr -s ' ' | cut -c1-160
fi
[ $SECONDS -lt 480 ] && save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
