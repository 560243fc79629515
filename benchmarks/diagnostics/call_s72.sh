#!/usr/bin/env bash
# For a next lease (carry .commit and .whl; ~7 min). Issue 17's unmet item, the FP8 / bf16
# decode ratio at Qwen2-0.5B heads (0.668 at B64 L4096, 0.653 at B16 L16384; target 0.6),
# with the warp-tile kernel's seq_len and first block ids read before the PDL wait
# (PAGEDRT_DECODE_PRE_WAIT=1) against without, in the order 1, 0, 0, 1: issue 17's decode
# figures (`pagedrt bench attention --kv-cache-dtype fp8`, the bf16 cache its peer).
set -u
. benchmarks/diagnostics/call_common.sh
for n in a:1 b:0 c:0 d:1; do
  IFS=: read -r name v <<< "$n"
  PAGEDRT_DECODE_PRE_WAIT=$v timeout 100 python3 -m pagedrt.entrypoints.cli bench attention \
    --kv-cache-dtype fp8 --decode-shapes \
    llama3-8b:64:4096,llama3-8b:8:32768,qwen2-0.5b:64:4096,qwen2-0.5b:16:16384 \
    --out "$out/r/att_pre$v$name" > "$out/r/att_pre$v$name.txt" 2>&1
  echo "att_pre$v$name status $?"; grep -iE "qwen2|llama3" "$out/r/att_pre$v$name.txt" | head -8
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
