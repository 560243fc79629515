#!/usr/bin/env bash
# The last two device calls of 2026-12-01, session 5, made one right after the other (the
# SmolLM2 GGUF travels in two parts; the machine keeps /tmp between them).
#   PART=1 (carry .gguf_parts/p1 .base .commit): keep p1 in /tmp; baca7b5 against HEAD offline
#     (benchmarks/paired_h200.sh: the 256 x 512/128 run twice each and the nano-vllm workload
#     twice each, both in ABBA order; batch-1 latency once each).
#   PART=2 (carry .gguf_parts/p2 .gguf_parts/md5 .whl .commit): join the GGUF; speculative
#     decoding (benchmarks/spec_h200.sh: batch 1, 256 requests in 2 ABBA rounds, the forced-on
#     sweep); beam search with the candidates and choice in torch ops against the Triton
#     kernels (benchmarks/beam_h200.sh, BEAM_AB=1, BEAM_TESTS=0).
set -u
out="${OUT:-out}"; mkdir -p "$out/r"
export PAGEDRT_COMMIT="$(cat .commit 2>/dev/null || echo head)"
. benchmarks/use_wheels.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "${PART:-1}" = 1 ]; then
  cp .gguf_parts/p1 /tmp/p1
  BASE=.base BASE_COMMIT=baca7b5 REPEATS=2 NANO_REPEATS=2 CAP=60 OUT="$out/r/paired" \
    timeout "${PAIRED_CAP:-480}" bash benchmarks/paired_h200.sh > "$out/r/paired.txt" 2>&1
  echo "== paired"; grep -E "FAILED|figure|tok/s|ms/token" "$out/r/paired.txt" | tail -8
else
  cat /tmp/p1 .gguf_parts/p2 > /tmp/smollm2.gguf
  [ "$(md5sum /tmp/smollm2.gguf | cut -d' ' -f1)" = "$(cat .gguf_parts/md5)" ] || echo "GGUF md5 differs"
  export SMOLLM2_GGUF=/tmp/smollm2.gguf
  mkdir -p "$out/r/spec" "$out/r/beam"
  OUT="$out/r/spec" BUDGET_S="${SPEC_CAP:-300}" timeout "${SPEC_CAP:-300}" \
    bash benchmarks/spec_h200.sh > "$out/r/spec.txt" 2>&1
  BEAM_AB=1 BEAM_TESTS=0 OUT="$out/r/beam" timeout "${BEAM_CAP:-250}" \
    bash benchmarks/beam_h200.sh > "$out/r/beam.txt" 2>&1
  echo "== spec"; grep -v -i warn "$out/r/spec.txt" | tail -26
  echo "== beam"; grep -v -i warn "$out/r/beam.txt" | tail -22
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
