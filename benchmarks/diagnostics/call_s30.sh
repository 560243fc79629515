#!/usr/bin/env bash
# 2026-12-02 16:05 UTC (carry .commit and .whl; ~2 min): the timing call_s29.sh PART=1 was
# first written for, cut down to the session's last device minutes: the decode kernel with
# each tile's block ids loaded one tile ahead (PAGEDRT_DECODE_BT_PREFETCH=1) against the
# defaults, bf16 and FP8, at three shapes.
set -u
. benchmarks/diagnostics/call_common.sh
cases=llama3-8b:64:4096,qwen2-0.5b:64:2048,llama3-8b:8:8192
export PAGEDRT_DECODE_BT_PREFETCH=1
tune prefetch --kv-cache-dtype both --cases $cases --block-n 64,128 --warps 4 --stages 3,4 \
  --splits 0 --maxnreg 0
export PAGEDRT_DECODE_BT_PREFETCH=0
timeout 60 python3 benchmarks/decode_tune.py --out "$out/r/tune_default" --default-only \
  --kv-cache-dtype both --cases $cases > "$out/r/tune_default.txt" 2>&1
echo "== without prefetch (defaults)"
grep -E "^(llama|qwen)" "$out/r/tune_default.txt" | tail -6 | cut -c1-75
echo "== with prefetch"; grep -E "^(llama|qwen)" "$out/r/tune_prefetch.txt" | tail -6 | cut -c1-200
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
