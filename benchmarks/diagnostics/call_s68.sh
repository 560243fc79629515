#!/usr/bin/env bash
# Issue 16 (carry .commit and .whl; ~5 min): the 1-4-row kernels' register pre-load before
# the PDL wait on the GPU: their GPU tests (unbuffered, verbose), then batch-1 latency with
# the L2 prefetch off (the default since this commit).
set -u
. benchmarks/diagnostics/call_common.sh
PYTHONUNBUFFERED=1 timeout 230 python3 -u -m pytest -v -m gpu -p no:cacheprovider \
  tests/gpu/test_fused_small_batch_gpu.py > "$out/r/gpu_small.txt" 2>&1
echo "gpu_small status $?"; grep -cE "PASSED" "$out/r/gpu_small.txt"; grep -E "FAILED|ERROR|passed|failed" "$out/r/gpu_small.txt" | tail -5
timeout 100 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat --out "$out/r" > "$out/r/lat.txt" 2>&1
echo "lat status $?"; grep -E "ms|ctx" "$out/r/lat.txt" | tail -2
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
