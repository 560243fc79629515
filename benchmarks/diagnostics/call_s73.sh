#!/usr/bin/env bash
# call_s69.sh again after the Triton 3.6 fix (carry .commit and .whl; ~7 min): at 642dbae the
# 8-128-row matmul did not compile on the device's Triton 3.6 unless PAGEDRT_MATMUL_PRE_WAIT=1
# (_first_w_tiles returned None), so call_s69's "off" runs fell back. GPU tests of the early
# reads and of the tiled matmul, then PAGEDRT_MATMUL_PRE_WAIT=1 / 0 ABBA at batches 8-128.
set -u
. benchmarks/diagnostics/call_common.sh
PYTHONUNBUFFERED=1 timeout 200 python3 -u -m pytest -v -m gpu -p no:cacheprovider \
  tests/gpu/test_pdl_early_reads_gpu.py tests/gpu/test_matmul_gpu.py > "$out/r/gpu_mm.txt" 2>&1
echo "gpu_mm status $?"; grep -E "FAILED|ERROR|passed|failed" "$out/r/gpu_mm.txt" | tail -8
pkill -f pytest; sleep 2  # nothing of the tests left on the GPU
switch_runs throughput PAGEDRT_MATMUL_PRE_WAIT pre1a:1 pre0a:0 pre0b:0 pre1b:1
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
