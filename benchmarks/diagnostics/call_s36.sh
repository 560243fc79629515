#!/usr/bin/env bash
# 2026-12-03 06:45 UTC (carry .commit, .whl, .gguf_parts/p1; ~6 min; a call carrying p2 and call_s37
# must follow within 30 s). The FP8 decode default is now the warp-tile kernel (BLOCK_N 32,
# one warp, 5 stages, splits for 8 programs per SM): its GPU tests (every FP8 launch against
# the reference, windows on _decode_kernel), and its default against bf16's at shapes the
# call_s35 grid did not cover. Keeps the first GGUF part in /tmp/gg (the tree leaves room
# for one 33 MB part per call; the next call copies p2 there).
set -u
mkdir -p /tmp/gg && cp .gguf_parts/p1 /tmp/gg/
. benchmarks/diagnostics/call_common.sh
gpu_tests fp8 330 tests/gpu/test_fp8_kv_gpu.py
tune def --kv-cache-dtype both --default-only \
  --cases llama3-8b:64:4096,llama3-8b:8:8192,qwen2-0.5b:64:4096,qwen2-0.5b:8:8192,qwen2-0.5b:64:2048,qwen2-0.5b:256:1024,llama3-8b:256:1024,llama3-8b:1:4096
echo "== tune def"; grep -E "^(llama|qwen)" "$out/r/tune_def.txt" | cut -c1-110
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
