#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit and .whl; ~4 min): every prologue candidate of the 1-4-row
# skinny matmul against its chain (prologue_times.py, Qwen2-0.5B shapes), then batch-1
# latency at ctx 512 / 4096 with the start-up timing's choices recorded in the JSON.
set -u
. benchmarks/diagnostics/call_common.sh
timeout 240 python3 benchmarks/diagnostics/prologue_times.py --rows 1,2,4 --shapes qwen2-0.5b \
  > "$out/r/prologue_times.txt" 2>&1
echo "prologue_times status $?"; tail -12 "$out/r/prologue_times.txt"
timeout 150 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat --out "$out/r" > "$out/r/lat.txt" 2>&1
echo "lat status $?"; grep -E "ms|ctx" "$out/r/lat.txt" | tail -6
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
