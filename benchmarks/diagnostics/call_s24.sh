#!/usr/bin/env bash
# 2026-12-02 12:55 UTC, the session's last device seconds: one-token chunks on a narrow tile in
# the extend kernel (NARROW_M), timed on and off in a mixed step (fp8_prefill_step.py
# --narrow). Carry .commit and .whl.
set -u
. benchmarks/diagnostics/call_common.sh
timeout 150 python3 benchmarks/diagnostics/fp8_prefill_step.py --narrow --out "$out/r/narrow" \
  > "$out/r/narrow.txt" 2>&1
echo "== narrow (status $?)"; grep "^narrow" "$out/r/narrow.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
