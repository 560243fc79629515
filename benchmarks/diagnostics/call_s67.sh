#!/usr/bin/env bash
# Issue 16 (carry .commit and .whl; ~8 min): the decode matmuls' weights into L2 before the
# PDL wait (PAGEDRT_L2_PREFETCH, on by default) on top of the 1-4-row register pre-loads:
# the GPU tests of both decode-matmul paths, batch-1 latency, then Qwen2-0.5B 512/128 at
# batches 8-128 with the prefetch on and off (one process each).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_mm 200 tests/gpu/test_fused_small_batch_gpu.py tests/gpu/test_matmul_gpu.py
timeout 120 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat --out "$out/r" > "$out/r/lat.txt" 2>&1
echo "lat status $?"; grep -E "ms|ctx" "$out/r/lat.txt" | tail -2
for n in pf:1 nopf:0; do
  IFS=: read -r name pf <<< "$n"
  PAGEDRT_L2_PREFETCH=$pf timeout 100 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 --name "thr_$name" \
    --out "$out/r" > "$out/r/thr_$name.txt" 2>&1
  echo "thr_$name status $?"
  grep -E "^pagedrt +qwen" "$out/r/thr_$name.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' '; echo
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
