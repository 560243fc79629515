#!/usr/bin/env bash
# Device calls of 2026-12-01, session 5, made one right after the other (the SmolLM2 GGUF
# travels in two parts, .gguf_parts/p1 and p2; the machine keeps /tmp between them).
#   PART=1 (carry .gguf_parts/p1 .base .commit): keep p1 in /tmp; the beam-search GPU tests
#     (the Triton choice kernel among them); baca7b5 against HEAD offline, alternated
#     (benchmarks/paired_h200.sh: the 256 x 512/128 run and batch-1 latency once each, the
#     nano-vllm workload 3 times each in ABBA order).
#   PART=2 (carry .gguf_parts/p2 .gguf_parts/md5 .whl .commit): join the GGUF; speculative
#     decoding (benchmarks/spec_h200.sh, its 256-request comparison in 2 ABBA rounds), the
#     speculative-decoding GPU tests (SmolLM2), beam search against n = 4 sampling and HF
#     (benchmarks/beam_h200.sh, BEAM_TESTS=0: part 1 ran them).
# Tables printed last; everything packed into $OUT/results.tgz.
set -u
out="${OUT:-out}"; mkdir -p "$out/r"
export PAGEDRT_COMMIT="$(cat .commit 2>/dev/null || echo head)"
. benchmarks/use_wheels.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "${PART:-1}" = 1 ]; then
  cp .gguf_parts/p1 /tmp/p1
  timeout "${TEST_CAP:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_beam_search_gpu.py > "$out/r/beam_gpu_tests.txt" 2>&1
  echo "== beam GPU tests (status $?)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/r/beam_gpu_tests.txt" | tail -8
  BASE=.base BASE_COMMIT=baca7b5 REPEATS=1 NANO_REPEATS=3 CAP=60 OUT="$out/r/paired" \
    timeout "${PAIRED_CAP:-400}" bash benchmarks/paired_h200.sh > "$out/r/paired.txt" 2>&1
  echo "== paired"; grep -E "FAILED|figure|tok/s|ms/token" "$out/r/paired.txt" | tail -8
else
  cat /tmp/p1 .gguf_parts/p2 > /tmp/smollm2.gguf
  [ "$(md5sum /tmp/smollm2.gguf | cut -d' ' -f1)" = "$(cat .gguf_parts/md5)" ] || echo "GGUF md5 differs"
  export SMOLLM2_GGUF=/tmp/smollm2.gguf
  mkdir -p "$out/r/spec" "$out/r/beam"
  OUT="$out/r/spec" BUDGET_S="${SPEC_CAP:-300}" timeout "${SPEC_CAP:-300}" \
    bash benchmarks/spec_h200.sh > "$out/r/spec.txt" 2>&1
  timeout "${SPEC_TEST_CAP:-70}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_spec_decode_gpu.py > "$out/r/spec_gpu_tests.txt" 2>&1
  echo "== spec GPU tests (status $?)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/r/spec_gpu_tests.txt" | tail -6
  BEAM_TESTS=0 OUT="$out/r/beam" timeout "${BEAM_CAP:-170}" bash benchmarks/beam_h200.sh \
    > "$out/r/beam.txt" 2>&1
  echo "== spec"; grep -v -i warn "$out/r/spec.txt" | tail -26
  echo "== beam"; grep -v -i warn "$out/r/beam.txt" | tail -14
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
