#!/usr/bin/env bash
# For the next lease, after call_s75.sh (carry .commit and .whl; ~8 min, each piece capped). Issue 16's batch
# targets (40 / 50 / 55% at batches 8 / 32 / 64): where a decode step's device time goes at
# those batches (the timeline by kernel, as call_s66 did at batch 1), the batch sweep of record
# with --repeats 3 (single runs spread 38-44k tok/s at batch 64 in call_s73), and Llama-3-8B's
# batch-1 latency with PRE_K (K = 4,096: 1,024 columns per row before the wait; its 4.46 ms
# target was met before PRE_K and not re-measured since).
set -u
. benchmarks/diagnostics/call_common.sh
for b in 8 32 64; do
  timeline_run $b 32 100
done
timeout 200 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
  --skip-step-split --batch-sizes 8,32,64,128 --repeats 3 --name sweep3 --out "$out/r" \
  > "$out/r/sweep3.txt" 2>&1
echo "sweep3 status $?"; grep -E "^pagedrt +qwen" "$out/r/sweep3.txt" | tail -5
timeout 120 python3 -m pagedrt.entrypoints.cli bench latency --preset llama3-8b \
  --contexts 512,4096 --graphs on --repeats 3 --name latency_llama3 --out "$out/r" \
  > "$out/r/latency_llama3.txt" 2>&1
echo "latency_llama3 status $?"; grep -E "batch1" "$out/r/latency_llama3.txt"
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
