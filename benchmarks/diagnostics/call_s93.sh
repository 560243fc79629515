#!/usr/bin/env bash
# For the next lease (carry .commit, .whl and .tcache; ~9 min): every GPU test (`pytest -m gpu
# tests/gpu`) now that decode graphs take staged inputs by default (aba7edb; only
# test_graph_inputs_gpu.py, test_smoke_gpu.py and test_philox_gpu.py ran with them, on an H100,
# 2026-12-05), then the batch-1 latency of record with the staged inputs on and off. The
# Triton cache of s27call2 (.tcache/tc.txz.00, 13 MB as xz) covers the engine's kernels; the
# tests' other kernels compile inside the 400 s cap where they can (a test file past it shows
# as the last one started in gpu_all.txt). Tables last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/gpu \
  > "$out/r/gpu_all.txt" 2>&1
echo "== all GPU tests (status $?)"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/r/gpu_all.txt" | tail -12
switch_runs latency PAGEDRT_STAGED_GRAPH_INPUTS on:1 off:0
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
