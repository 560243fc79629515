#!/usr/bin/env bash
# GPU tests after the speculative-decoding device side moved into pagedrt/engine/spec_runner.py
# (`2d95e4e`) and the beam-search scheduling into pagedrt/engine/beam_scheduling.py (`6ed5281`;
# carry .commit, .whl and .tcache; about 4 min): tests/gpu/test_spec_decode_gpu.py (the
# verification path's pinned staging and graphs on CUDA), test_beam_search_gpu.py and
# test_smoke_gpu.py in three shards, then the Triton cache back where time allows
# ($OUT/tc.txz.NN). Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests_sharded gpu 230 3 tests/gpu/test_spec_decode_gpu.py tests/gpu/test_beam_search_gpu.py tests/gpu/test_smoke_gpu.py
[ $SECONDS -lt 200 ] && save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
