#!/usr/bin/env bash
# Session of 2026-12-02 (08:30 UTC), last device call (carry .commit .whl): the FP8 decode
# kernel's new default launch (2 stages, registers capped at 128: `_decode_launch_config`)
# timed against the old one (3 stages, no cap) and the bf16 peer on Llama-3-8B heads, and on
# Qwen2-0.5B heads; then the FP8 GPU tests under the new default.
set -u
. benchmarks/diagnostics/call_common.sh
timeout 80 python3 benchmarks/decode_tune.py --out "$out/r/tune_new" --kv-cache-dtype fp8 \
  --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 --block-n 128 --warps 4 --stages 3 --splits 1,4 \
  --maxnreg 0 > "$out/r/tune_new.txt" 2>&1
timeout 40 python3 benchmarks/decode_tune.py --out "$out/r/tune_bf16" --cases llama3-8b:64:4096 \
  --block-n 64 --warps 4 --stages 3 --splits 1 > "$out/r/tune_bf16.txt" 2>&1
gpu_tests gpu_fp8 170 tests/gpu/test_fp8_kv_gpu.py
echo "== decode kernel"; grep -h "default" "$out"/r/tune_new.txt "$out"/r/tune_bf16.txt | sort -u | cut -c1-250
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
