#!/usr/bin/env bash
# 2026-12-02 15:50 UTC. Carry .commit and .whl, and the SmolLM2 GGUF's parts over three calls
# made right after each other (PART=1 with .gguf_parts/p1, PART=2 with p2, PART=3 with p3 and
# md5; each part is kept in /tmp until PART=3 joins them).
# PART=1 (~4 min): the decode kernel with each tile's block ids loaded one tile ahead
#   (PAGEDRT_DECODE_BT_PREFETCH=1: the TTGIR compiled for sm_90 on the CPU then has
#   num_stages - 1 buffers per K/V tile, bf16 and FP8, against one at 2-4 stages without it),
#   against the defaults in the same process tree, bf16 and FP8, at each shape's default splits.
# PART=2: only the part.
# PART=3 (~2 min): the real SmolLM2's accuracy with an FP8 cache under a bf16 model on the GPU
#   (`bench accuracy`: perplexity and greedy agreement against the bf16 cache), with a
#   prompt's prefill reading its own rows (FRESH_CHUNK_KV, not measured on real weights yet).
set -u
. benchmarks/diagnostics/call_common.sh
cp .gguf_parts/p[0-9] /tmp/ 2>/dev/null
cases=llama3-8b:64:4096,qwen2-0.5b:64:2048,qwen2-0.5b:64:4096,llama3-8b:8:8192
cases=$cases,qwen2-0.5b:8:4096,qwen2-0.5b:1:4096
case "${PART:-1}" in
1)
export PAGEDRT_DECODE_BT_PREFETCH=1
tune prefetch --kv-cache-dtype both --cases $cases --block-n 64,128 --warps 4 --stages 2,3,4 \
  --splits 0 --maxnreg 0,128
export PAGEDRT_DECODE_BT_PREFETCH=0
timeout 100 python3 benchmarks/decode_tune.py --out "$out/r/tune_default" --default-only \
  --kv-cache-dtype both --cases $cases > "$out/r/tune_default.txt" 2>&1
echo "== without prefetch (defaults)"
grep -E "^(llama|qwen)" "$out/r/tune_default.txt" | tail -12 | cut -c1-75
echo "== with prefetch"; grep -E "^(llama|qwen)" "$out/r/tune_prefetch.txt" | tail -12 | cut -c1-200
;;
3)
. benchmarks/diagnostics/join_gguf.sh
timeout 150 python3 -m pagedrt.entrypoints.cli bench accuracy --model "$SMOLLM2_GGUF" \
  --dtype bfloat16 --kv-cache-dtype fp8 --name acc_fp8 --out "$out/r" > "$out/r/acc_fp8.txt" 2>&1
echo "== accuracy (status $?)"; tail -8 "$out/r/acc_fp8.txt"
;;
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
