#!/usr/bin/env bash
# Issue 16's Llama-3-8B shape row and issue 17's decode ratios on the next H200 (carry .commit,
# .whl and .tcache; ~7 min): `bench throughput --preset llama3-8b --skip-step-split` with
# --num-scheduler-steps 1 (first: it times the Llama-3-8B configs into the config cache) and 8,
# one process each; then `bench attention --kv-cache-dtype fp8` at the four shapes of record
# (FP8 against the bf16 cache in one process); a second 1 / 8 pair where time is left.
# Results in $OUT/r; the summary lines last.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
llama() {  # name, cap, K
  local t0=$SECONDS
  timeout "$2" python3 -m pagedrt.entrypoints.cli bench throughput --preset llama3-8b \
    --skip-step-split --num-scheduler-steps "$3" --name "$1" --out "$out/r" \
    > "$out/r/$1.txt" 2>&1
  echo "$1 (K=$3) status $? in $((SECONDS - t0))s: $(grep -E "^pagedrt +llama" "$out/r/$1.txt" \
    | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
  grep -h "decode steps\|start-up" "$out/r/$1.txt" | cut -c1-140
}
{
  llama llama_k1a 220 1
  llama llama_k8a 90 8
  t0=$SECONDS
  timeout 120 python3 -m pagedrt.entrypoints.cli bench attention --kv-cache-dtype fp8 \
    --decode-shapes llama3-8b:64:4096,llama3-8b:8:32768,qwen2-0.5b:64:4096,qwen2-0.5b:16:16384 \
    --out "$out/r/fp8" > "$out/r/fp8.txt" 2>&1
  echo "fp8 attention status $? in $((SECONDS - t0))s"; tail -12 "$out/r/fp8.txt"
  if [ $SECONDS -lt 330 ]; then  # (the session's device time is short: a second pair if it fits)
    llama llama_k1b 60 1
    llama llama_k8b 60 8
  fi
} 2>&1 | tee "$out/r/summary.txt"
rm -f "$out"/r/*.png
