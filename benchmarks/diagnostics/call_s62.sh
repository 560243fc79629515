#!/usr/bin/env bash
# Issue 16 (carry .commit and .whl; ~2.5 min): Qwen2-0.5B 512/128 at batches 8-128 with the
# RoPE epilogue of the 8-128-row QKV matmul (the default) and with PAGEDRT_FUSED_ROPE=0.
set -u
. benchmarks/diagnostics/call_common.sh
for n in rope:1 plain:0; do
  IFS=: read -r name rope <<< "$n"
  PAGEDRT_FUSED_ROPE=$rope timeout 80 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 --name "thr_$name" \
    --out "$out/r" > "$out/r/thr_$name.txt" 2>&1
  echo "thr_$name status $?"
  grep -E "^pagedrt +qwen" "$out/r/thr_$name.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' '; echo
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
