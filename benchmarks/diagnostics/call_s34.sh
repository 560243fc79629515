#!/usr/bin/env bash
# 2026-12-02 20:15 UTC (carry .commit and .whl; ~4 min). call_s33: the warp-tile kernel over FP8
# at 128/4/5 took 163.2 us against 202.3 for _decode_kernel's default and 245.6 for bf16
# (Llama-3-8B heads B64 L4096; 0.66x of bf16), the same at B8 L8192 and Qwen2-0.5B heads.
# Widen its grid: 256-token tiles, 4-6 stages, 2-8 warps.
set -u
. benchmarks/diagnostics/call_common.sh
tune wt --kv-cache-dtype fp8 --cases llama3-8b:64:4096,llama3-8b:8:8192,qwen2-0.5b:64:4096 \
  --block-n 128,256 --warps 4,8 --stages 4,5,6 --splits 0 --warp-tiles 1
echo "== tune wt"; grep -E "^(llama|qwen)" "$out/r/tune_wt.txt" | tail -3 | cut -c1-330
tune wt2 --kv-cache-dtype both --cases llama3-8b:64:4096,qwen2-0.5b:64:4096,qwen2-0.5b:64:2048 \
  --block-n 64,128 --warps 2 --stages 3,5 --splits 0 --warp-tiles 1
echo "== tune wt2"; grep -E "^(llama|qwen)" "$out/r/tune_wt2.txt" | tail -6 | cut -c1-330
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
