#!/usr/bin/env bash
# The GPU tests left unrun by the session of 2026-12-07 17:36, now under auto multi-step
# (carry .commit and .whl; ~9 min; CAP=N caps the shards at N s instead of 420):
# the multi-step, staged-input, smoke, beam-search and spec-decode files in 4 pytest processes
# at once, capped at 420 s each, then the Triton cache saved into $OUT (tc.txz.NN) for the
# next call. Results in $OUT/r; the summary lines last.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/r/gpu.txt"
{
  gpu_tests_sharded unrun "${CAP:-420}" 4 tests/gpu/test_multi_step_gpu.py \
    tests/gpu/test_graph_inputs_gpu.py tests/gpu/test_smoke_gpu.py \
    tests/gpu/test_beam_search_gpu.py tests/gpu/test_spec_decode_gpu.py
} 2>&1 | tee "$out/r/summary.txt"
save_triton_cache
