#!/usr/bin/env bash
# Issue 16 (carry .commit, .whl and .base = `git archive 5db82a9 pagedrt`; ~8 min): the tree
# before the cold-L2 timing and long-K tiles at batch 1 (Qwen2-0.5B, run from inside .base),
# then HEAD on the Llama-3-8B shape: batch-1 latency at ctx 512 / 4,096 and 256 x 512/128
# (targets <= 4.46 ms and >= 7,185 tok/s).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
(cd .base && PYTHONPATH="/tmp/site:$PWD" timeout 100 python3 -m pagedrt.entrypoints.cli \
  bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 \
  --name lat_base --out "$out/r" > "$out/r/lat_base.txt" 2>&1)
echo "lat_base status $?"; grep -E "batch1" "$out/r/lat_base.txt"
timeout 180 python3 -m pagedrt.entrypoints.cli bench latency --preset llama3-8b \
  --contexts 512,4096 --graphs on --repeats 3 --name latency_llama3 --out "$out/r" \
  > "$out/r/latency_llama3.txt" 2>&1
echo "latency_llama3 status $?"; grep -E "batch1" "$out/r/latency_llama3.txt"
timeout 220 python3 -m pagedrt.entrypoints.cli bench throughput --preset llama3-8b \
  --skip-step-split --name tput_llama3 --out "$out/r" > "$out/r/tput_llama3.txt" 2>&1
echo "tput_llama3 status $?"; grep -E "^pagedrt +llama" "$out/r/tput_llama3.txt"
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
