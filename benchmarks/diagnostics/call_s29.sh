#!/usr/bin/env bash
# 2026-12-02 15:50 UTC. Carry .commit and .whl, and the SmolLM2 GGUF's parts over three calls
# made right after each other (PART=1 with .gguf_parts/p1, PART=2 with p2, PART=3 with p3 and
# md5; each part is kept in /tmp until PART=3 joins them).
# PART=1 and PART=2: only the part (run as `cp .gguf_parts/pN /tmp/` in two calls right before
#   PART=3; PART=1 was first written to also time the block-table prefetch, which the device's
#   refused starts moved to call_s30.sh).
# PART=3 (~2 min): the real SmolLM2's accuracy with an FP8 cache under a bf16 model on the GPU
#   (`bench accuracy`: perplexity and greedy agreement against the bf16 cache), with a
#   prompt's prefill reading its own rows (FRESH_CHUNK_KV, not measured on real weights yet).
set -u
. benchmarks/diagnostics/call_common.sh
cp .gguf_parts/p[0-9] /tmp/ 2>/dev/null
case "${PART:-1}" in
3)
. benchmarks/diagnostics/join_gguf.sh
timeout 150 python3 -m pagedrt.entrypoints.cli bench accuracy --model "$SMOLLM2_GGUF" \
  --dtype bfloat16 --kv-cache-dtype fp8 --name acc_fp8 --out "$out/r" > "$out/r/acc_fp8.txt" 2>&1
echo "== accuracy (status $?)"; tail -8 "$out/r/acc_fp8.txt"
;;
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
