#!/usr/bin/env bash
# 2026-12-03 06:05 UTC (carry .commit and .whl; ~5 min). call_s34: warp tiles over FP8 at
# BLOCK_N 64 / 2 warps / 5 stages took 138.3 us at Llama-3-8B heads B64 L4096 (bf16 246.0:
# 0.56x) and 28.4 at Qwen2-0.5B heads B64 L4096 (bf16 39.7: 0.72x). Smaller tiles and fewer
# warps won; go further down (BLOCK_N 32, 1 warp, more stages) and over the split count.
set -u
. benchmarks/diagnostics/call_common.sh
tune wt3 --kv-cache-dtype fp8 \
  --cases llama3-8b:64:4096,llama3-8b:8:8192,qwen2-0.5b:64:4096,qwen2-0.5b:64:2048 \
  --block-n 32,64 --warps 1,2 --stages 4,5,6,7 --splits 0 --warp-tiles 1
echo "== tune wt3"; grep -E "^(llama|qwen)" "$out/r/tune_wt3.txt" | tail -4 | cut -c1-330
tune wt4 --kv-cache-dtype fp8 --cases qwen2-0.5b:64:4096,qwen2-0.5b:8:8192,llama3-8b:8:8192 \
  --block-n 32,64 --warps 1,2 --stages 5,6 --splits 1,2,4,8,16 --warp-tiles 1
echo "== tune wt4"; grep -E "^(llama|qwen)" "$out/r/tune_wt4.txt" | tail -3 | cut -c1-330
tune bf --kv-cache-dtype auto --cases qwen2-0.5b:8:8192,llama3-8b:8:8192 --default-only
echo "== tune bf"; grep -E "^(llama|qwen)" "$out/r/tune_bf.txt" | tail -2 | cut -c1-200
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
