#!/usr/bin/env bash
# 2026-12-02 15:30 UTC (first call of the session; carry .commit and .whl):
# (0, ~1 min) tests/gpu/test_extend_decode_rows_gpu.py (the narrow tile, never run on a GPU);
# (1, ~2 min) a mixed step's extend launch with the narrow tile on and off
#   (fp8_prefill_step.py --narrow);
# (2, ~3 min) the decode kernel with K stored head-major (one head's tokens of a block
#   contiguous, 2 KB in FP8 at head_dim 128, instead of 128-byte rows 1 KB apart) against the
#   usual layout, FP8 and bf16, at the default launch setting and a small FP8 grid
#   (decode_tune.py --k-head-major): is the FP8 kernel's 2.6 TB/s the access pattern?
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_narrow 120 tests/gpu/test_extend_decode_rows_gpu.py
timeout 200 python3 benchmarks/diagnostics/fp8_prefill_step.py --narrow --out "$out/r/narrow" \
  > "$out/r/narrow.txt" 2>&1
echo "== narrow (status $?)"; grep "^narrow" "$out/r/narrow.txt"
cases=llama3-8b:64:4096,qwen2-0.5b:64:4096,llama3-8b:8:8192
for hm in "" --k-head-major; do
  timeout 150 python3 benchmarks/decode_tune.py --out "$out/r/layout$hm" --default-only \
    --kv-cache-dtype both --cases $cases $hm > "$out/r/layout$hm.txt" 2>&1
  echo "== layout $hm (status $?)"; grep -E "^(llama|qwen)" "$out/r/layout$hm.txt" | cut -c1-60
done
tune fp8hm --kv-cache-dtype fp8 --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 --k-head-major \
  --block-n 64,128 --warps 4,8 --stages 2,3 --splits 1 --maxnreg 0,128
echo "== tune fp8 head-major"; tail -2 "$out/r/tune_fp8hm.txt" | cut -c1-200
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
