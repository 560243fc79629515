#!/usr/bin/env bash
# One H200 call for what this session needs most (carry .commit, .whl and .tcache; at most
# ~7.5 min): issue 16's batch-1 rows as call_s132.sh (Qwen2-0.5B `bench latency --preset
# qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3`, then PAGEDRT_SAMPLE_SPLIT=0 as the
# peer), then the GPU tests of the two refactors of 2026-12-06 evening (call_s133.sh's:
# speculative decoding, beam search and the smoke tests, three shards), each step skipped
# where too little of the call is left. Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_env lat_split1 150 ""
[ $SECONDS -lt 170 ] && latency_env lat_split0 50 "PAGEDRT_SAMPLE_SPLIT=0"
[ $SECONDS -lt 260 ] && gpu_tests_sharded gpu $((430 - SECONDS)) 3 \
  tests/gpu/test_spec_decode_gpu.py tests/gpu/test_beam_search_gpu.py tests/gpu/test_smoke_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
