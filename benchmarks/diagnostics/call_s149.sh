#!/usr/bin/env bash
# Batch-1 decode attention in one pass (carry .commit, .whl and .tcache; ~4 min, either card):
# at batch 1 the attention and its split-K reduce take about 5.5 us a layer on an H100 for
# 262 KB of K/V at context 512, about a fifth of the step (docs/design.md, "Small-batch
# decode"). Can one warp-tile program per KV head with many warps (BLOCK_N 256-512, 8-16
# warps, one loop step at context 512, no reduce) beat the split launch? `decode_tune.py` at
# Qwen2-0.5B heads, batch 1 and 8, contexts 512 and 4,096 (bf16, then FP8), every setting
# checked against the reference first, compiled in 8 shards, timed in one process; then
# whole batch-1 steps with the launch overridden.
# Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
cases=qwen2-0.5b:1:512,qwen2-0.5b:1:4096,qwen2-0.5b:8:512
tune b1 --cases $cases --block-n 32,128,256,512 --warps 1,4,8,16 --stages 1,2,5 \
  --splits 1,2,4,8,16,64 --warp-tiles 1
grep -E "default|best" "$out/r/tune_b1.txt" | cut -c1-200
tune b1fp8 --cases $cases --kv-cache-dtype fp8 --block-n 32,256,512 --warps 1,8,16 \
  --stages 1,5 --splits 1,2,8,64 --warp-tiles 1
grep -E "default|best" "$out/r/tune_b1fp8.txt" | cut -c1-200
# whole batch-1 steps with the launch overridden (PAGEDRT_DECODE_BATCH1_CONFIG; the config
# cache's choices are shared, the variable is not fingerprinted), ABBA
switch_runs latency PAGEDRT_DECODE_BATCH1_CONFIG def1: one1:512,16,1,1 one2:512,16,1,1 \
  def2: two1:256,8,2,2
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
