#!/usr/bin/env bash
# Device calls of 2026-12-01, session 5, made in pairs one right after the other (the SmolLM2
# GGUF travels in two parts, .gguf_parts/p1 and p2; the machine keeps /tmp between them).
#   PART=1 (carry .gguf_parts/p1 .base .commit): keep p1 in /tmp; the beam-search GPU tests
#     (BEAM_GPU_TESTS=1: the Triton choice and candidate kernels among them); baca7b5 against
#     HEAD offline, alternated (benchmarks/paired_h200.sh: the 256 x 512/128 run REPEATS times
#     each, the nano-vllm workload NANO_REPEATS times each, both in ABBA order; batch-1
#     latency once each).
#   PART=2 (carry .gguf_parts/p2 .gguf_parts/md5 .whl .commit): join the GGUF; speculative
#     decoding (benchmarks/spec_h200.sh: batch 1, 256 requests in 2 ABBA rounds, the forced-on
#     sweep), its GPU tests (SPEC_GPU_TESTS=1, SmolLM2), beam search against n = 4 sampling and
#     HF (benchmarks/beam_h200.sh without its GPU tests; BEAM_AB=1 also runs it with the
#     candidates and choice in torch ops).
# Calls 1 and 2 ran the defaults; calls 4 and 5 REPEATS=2 NANO_REPEATS=2 BEAM_GPU_TESTS=0
# SPEC_GPU_TESTS=0 BEAM_AB=1 PAIRED_CAP=430 SPEC_CAP=230 BEAM_CAP=200.
# Tables printed last; everything packed into $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
if [ "${PART:-1}" = 1 ]; then
  cp .gguf_parts/p1 /tmp/p1
  [ "${BEAM_GPU_TESTS:-1}" = 1 ] && gpu_tests beam_gpu_tests "${TEST_CAP:-150}" \
    tests/gpu/test_beam_search_gpu.py
  BASE=.base BASE_COMMIT=baca7b5 REPEATS="${REPEATS:-1}" NANO_REPEATS="${NANO_REPEATS:-3}" \
    CAP=60 OUT="$out/r/paired" timeout "${PAIRED_CAP:-400}" bash benchmarks/paired_h200.sh \
    > "$out/r/paired.txt" 2>&1
  echo "== paired"; grep -E "FAILED|figure|tok/s|ms/token" "$out/r/paired.txt" | tail -8
else
  . benchmarks/diagnostics/join_gguf.sh
  mkdir -p "$out/r/spec" "$out/r/beam"
  OUT="$out/r/spec" BUDGET_S="${SPEC_CAP:-300}" timeout "${SPEC_CAP:-300}" \
    bash benchmarks/spec_h200.sh > "$out/r/spec.txt" 2>&1
  [ "${SPEC_GPU_TESTS:-1}" = 1 ] && gpu_tests spec_gpu_tests "${SPEC_TEST_CAP:-70}" \
    tests/gpu/test_spec_decode_gpu.py
  BEAM_AB="${BEAM_AB:-0}" BEAM_TESTS=0 OUT="$out/r/beam" timeout "${BEAM_CAP:-170}" \
    bash benchmarks/beam_h200.sh > "$out/r/beam.txt" 2>&1
  echo "== spec"; grep -v -i warn "$out/r/spec.txt" | tail -26
  echo "== beam"; grep -v -i warn "$out/r/beam.txt" | tail -22
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
