#!/usr/bin/env bash
# Prepared 2026-12-02 13:05 UTC for the next session (this one ran out of device time):
# (0, ~1 min) tests/gpu/test_extend_decode_rows_gpu.py (the narrow tile compiled, never run yet);
# (1, ~2 min) one-token chunks on a narrow tile in the extend kernel (NARROW_M, on by
#   default since 38b5605, untimed): a mixed step's extend launch with the narrow tile on and
#   off (fp8_prefill_step.py --narrow);
# (2, ~5 min) Llama-3-8B 256 x 4,096 / 256 FP8 against bf16 with it (0.95x at 721cf4e).
# Carry .commit and .whl.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_narrow 120 tests/gpu/test_extend_decode_rows_gpu.py
timeout 200 python3 benchmarks/diagnostics/fp8_prefill_step.py --narrow --out "$out/r/narrow" \
  > "$out/r/narrow.txt" 2>&1
echo "== narrow (status $?)"; grep "^narrow" "$out/r/narrow.txt"
fp8_vs_bf16 fp8kv_256 256 4096 256 4368
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
