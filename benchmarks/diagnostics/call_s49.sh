#!/usr/bin/env bash
# 2026-12-03 23:40 UTC (carry .commit and .whl; ~6 min). Issue 16's host work: cProfile of
# the engine's host over one nano-vllm run and one 256 x 512/128 greedy run on the H200's host
# (host_profile.py), then the nano-vllm workload's figure at this commit (3 repeats, step trace).
set -u
. benchmarks/diagnostics/call_common.sh

timeout 150 python3 benchmarks/diagnostics/host_profile.py --workload nanovllm --out "$out/r" \
  > "$out/r/host_nano.log" 2>&1; echo "host_profile nano status $?"
head -4 "$out/r/host_nano.log"
timeout 120 python3 benchmarks/diagnostics/host_profile.py --workload fixed --out "$out/r" \
  > "$out/r/host_fixed.log" 2>&1; echo "host_profile fixed status $?"
head -4 "$out/r/host_fixed.log"
timeout 150 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
  --workload nanovllm --repeats 3 --skip-step-split --name nano --out "$out/r" \
  > "$out/r/nano.txt" 2>&1; echo "nano status $?"
python3 benchmarks/trace_summary.py "$out/r/nano.json" 2>&1 | tail -3
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
