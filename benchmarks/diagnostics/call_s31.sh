#!/usr/bin/env bash
# 2026-12-02 16:17 UTC, run right after call_s30.sh on the warm machine (carry .commit and
# .whl; ~20 s): block ids loaded one tile ahead at 64/4/3 against the defaults without it, on
# five Qwen2-0.5B (bf16) shapes, the engine's B256 L640 among them.
set -u
. benchmarks/diagnostics/call_common.sh
c=qwen2-0.5b:64:4096,qwen2-0.5b:8:4096,qwen2-0.5b:1:4096,qwen2-0.5b:256:640,qwen2-0.5b:64:2048
PAGEDRT_DECODE_BT_PREFETCH=1 timeout 70 python3 benchmarks/decode_tune.py --out "$out/r/pf" \
  --cases $c --block-n 64 --warps 4 --stages 3 --splits 0 > "$out/r/pf.txt" 2>&1
timeout 40 python3 benchmarks/decode_tune.py --out "$out/r/nopf" --cases $c --default-only \
  > "$out/r/nopf.txt" 2>&1
grep -E "^qwen" "$out/r/pf.txt" | tail -5 | cut -c1-140
grep -E "^qwen" "$out/r/nopf.txt" | tail -5 | cut -c1-80
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
