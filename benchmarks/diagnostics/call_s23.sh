#!/usr/bin/env bash
# 2026-12-02 12:25 UTC, the session's last ~5 device minutes: the opt-in fused split-K reduce
# (PAGEDRT_DECODE_FUSED_REDUCE=1, 196863f): its GPU test first, then the default launch
# timed both ways at bf16 on the small-batch Qwen2 shapes (issue 16). Carry .commit, .whl.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_fused 100 tests/gpu/test_decode_fused_reduce_gpu.py
timeout 80 python3 benchmarks/decode_tune.py --out "$out/r/tune_fused" --default-only \
  --fused-reduce 0,1 --kv-cache-dtype auto \
  --cases qwen2-0.5b:1:512,qwen2-0.5b:1:4096,qwen2-0.5b:8:2048,qwen2-0.5b:64:2048 \
  > "$out/r/tune_fused.txt" 2>&1
echo "== tune (status $?)"; tail -14 "$out/r/tune_fused.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
