#!/usr/bin/env bash
# 2026-12-02 15:50 UTC (carry .commit and .whl). The decode kernel's TTGIR, compiled for sm_90
# on the CPU, has ONE shared-memory buffer per K/V tile at num_stages 2-4 (the block-table
# load takes a stage of the pipeline, so the next tile's copies are issued after the current
# tile's products and waited for at once: no overlap inside a program) and two at 5, where the
# loop waits only for the older copies (async_wait num=5). Time stages 3 against 5 and 6, bf16
# and FP8, at each shape's default split count.
set -u
. benchmarks/diagnostics/call_common.sh
tune stages --kv-cache-dtype both \
  --cases llama3-8b:64:4096,qwen2-0.5b:64:4096,qwen2-0.5b:64:2048,llama3-8b:8:8192,$(
  )qwen2-0.5b:8:4096,qwen2-0.5b:1:4096 \
  --block-n 32,64,128 --warps 4 --stages 3,5,6 --splits 0 --maxnreg 0,128
echo "== tune stages"; grep -E "^(llama|qwen)" "$out/r/tune_stages.txt" | tail -12 | cut -c1-230
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
