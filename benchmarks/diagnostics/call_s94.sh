#!/usr/bin/env bash
# For the lease after call_s93.sh, on an H200 (carry .commit, .whl and .tcache; ~9 min): the
# issue-16 and issue-17 status under today's defaults (decode graphs with staged inputs since
# aba7edb): every command of benchmarks/h200_record.sh (HF peers included), then issue 17's
# FP8 decode kernel against bf16 at the four shapes of its status table. Tables last;
# everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
OUT="$out/r/record" timeout 420 bash benchmarks/h200_record.sh > "$out/r/record.txt" 2>&1
echo "== h200_record.sh (status $?)"; tail -25 "$out/r/record.txt" | cut -c1-160
timeout 100 python3 -m pagedrt.entrypoints.cli bench attention --kv-cache-dtype fp8 \
  --decode-shapes llama3-8b:64:4096,llama3-8b:8:32768,qwen2-0.5b:64:4096,qwen2-0.5b:16:16384 \
  --out "$out/r/att_fp8" > "$out/r/att_fp8.txt" 2>&1
echo "== fp8 decode (status $?)"; grep -iE "qwen2|llama3" "$out/r/att_fp8.txt" | head -8
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
