#!/usr/bin/env bash
# 2026-12-02 12:55 UTC, after call_s19 PART=2 showed FP8 prefill steps still at 543 ms
# against bf16's 425 with FRESH_CHUNK_KV (which should have removed the FP8 cost of a
# prompt's own keys). Carry .commit and .whl.
# (1, ~4 min) benchmarks/diagnostics/fp8_prefill_step.py: the attention of a mixed step
#   (4 prompts x 4096 with 0/48/96 decode rows in one extend launch), bf16 against FP8, and
#   the engine's device time by kernel over two 16k-token prefill steps with each cache;
# (2, ~2 min) `pagedrt bench attention --kv-cache-dtype fp8` with and without
#   PAGEDRT_FP8_PREFILL_MMA=1 (the prefill row: the prompt's keys from the rows, and every key
#   from the cache), call_s19 PART=1's run that failed on an argument it does not take.
set -u
. benchmarks/diagnostics/call_common.sh
timeout 330 python3 benchmarks/diagnostics/fp8_prefill_step.py --out "$out/r/prefill_step" \
  > "$out/r/prefill_step.txt" 2>&1
echo "== prefill step (status $?)"; tail -30 "$out/r/prefill_step.txt"
for mma in 0 1; do
  PAGEDRT_FP8_PREFILL_MMA=$mma timeout 90 python3 -m pagedrt.entrypoints.cli bench attention \
    --kv-cache-dtype fp8 --decode-shapes llama3-8b:64:4096 --out "$out/r/att_mma$mma" \
    > "$out/r/att_mma$mma.txt" 2>&1
done
echo "== extend over FP8 (FP8 products off, on)"; grep -h "over FP8" "$out"/r/att_mma*.txt
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
