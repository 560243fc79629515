#!/usr/bin/env bash
# The decode attention with the early reads removed (its files f7a85b6's again): the decode,
# PDL-ordering and fused-reduce GPU tests. One GPU; carry .commit, .whl and .tcache; ~3 min.
# Unrun on 2026-12-06: the session's device time was spent (the next session's first call).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests decode 170 tests/gpu/test_decode_gpu.py tests/gpu/test_pdl_early_reads_gpu.py \
  tests/gpu/test_decode_fused_reduce_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
