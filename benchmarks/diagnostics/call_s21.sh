#!/usr/bin/env bash
# 2026-12-02 13:15 UTC, after call_s20: the extend kernel over an FP8 cache with the prompts'
# own rows (no fp8 read at all) took 3.37 ms against bf16's 1.40 (4 x 4,096 tokens,
# Llama-3-8B heads). Sweep its launch configs with registers and spills per compiled kernel
# (fp8_prefill_step.py --sweep). Carry .commit and .whl.
set -u
. benchmarks/diagnostics/call_common.sh
timeout 400 python3 benchmarks/diagnostics/fp8_prefill_step.py --sweep --out "$out/r/sweep" \
  > "$out/r/sweep.txt" 2>&1
echo "== sweep (status $?)"; tail -12 "$out/r/sweep.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
