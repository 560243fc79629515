#!/usr/bin/env bash
# For the next lease (carry .commit and .whl; ~8 min). Issue 16, batches 8-128: the opt-ins
# of 2026-12-04 on a GPU nobody else uses. First the GPU tests of both and of what each
# kernel reads before its PDL wait (test_pdl_early_reads_gpu.py), then Qwen2-0.5B
# 512/128 at batches 8-128 with PAGEDRT_MATMUL_PRE_WAIT=1 / 0 in ABBA order, then the batch-1
# step's timeline with each projection's matmul apart. (call_s70-72, planned after it, never ran as written: call_s74 and the inline sweeps of 2026-12-04 11:4x took their place.)
set -u
. benchmarks/diagnostics/call_common.sh
PYTHONUNBUFFERED=1 timeout 240 python3 -u -m pytest -v -m gpu -p no:cacheprovider \
  tests/gpu/test_pdl_early_reads_gpu.py tests/gpu/test_matmul_gpu.py \
  -k "early or before_the_wait or engine_tokens" > "$out/r/gpu_mm.txt" 2>&1
echo "gpu_mm status $?"; grep -E "FAILED|ERROR|passed|failed" "$out/r/gpu_mm.txt" | tail -5
pkill -f pytest; sleep 2  # nothing of the tests left on the GPU
switch_runs throughput PAGEDRT_MATMUL_PRE_WAIT pre1a:1 pre0a:0 pre0b:0 pre1b:1
timeout 90 python3 benchmarks/diagnostics/decode_timeline.py --batch 1 --context 512 \
  --steps 48 --out "$out/r/tl_b1.json" > "$out/r/tl_b1.txt" 2>&1
echo "tl_b1 status $?"; grep -E "^batch|#|^total" "$out/r/tl_b1.txt" | head -8
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
