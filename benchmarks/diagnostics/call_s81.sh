#!/usr/bin/env bash
# Issue 16 (carry .commit and .whl; one 10-minute call, each piece capped, the last one given
# what is left): where a decode step's device time goes at batches 256, 64 and 8 (the timeline
# by kernel, as call_s77 did at batch 1; 256 rows is the 256 x 512/128 workload's decode step,
# 1.86 ms against a 0.66 ms floor), then batch-1 latency per forced gate/up and down config
# (batch1_forced_configs.py, one round: does the start-up timing pick the in-step fastest).
set -u
. benchmarks/diagnostics/call_common.sh
for b in 256 64 8; do
  timeline_run $b 16 130
done
left=$((560 - SECONDS))
timeout "$left" python3 benchmarks/diagnostics/batch1_forced_configs.py --ops gate_up,down \
  --rounds 1 --repeats 3 --out "$out/r/forced.json" > "$out/r/forced.txt" 2>&1
echo "forced status $? at ${SECONDS}s"; grep -vE "Warning|warn" "$out/r/forced.txt" | tail -30
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
