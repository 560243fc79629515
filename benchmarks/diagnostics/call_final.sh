#!/usr/bin/env bash
# Device calls of 2026-12-01, session 4: two calls made one right after the other (the SmolLM2
# GGUF travels in two parts, .gguf_parts/p1 and p2; the machine keeps /tmp between them).
#   PART=A (carry .gguf_parts/p1 .base .commit): keep p1 in /tmp; GPU tests of the tensor-
#     parallel, FP8-cache and fused small-batch paths; the FP8 decode kernel (V dim-major)
#     against bf16 (`bench attention --kv-cache-dtype fp8`); batch-1 latency with the small-batch
#     fusion off (PAGEDRT_FUSED_SMALL_BATCH=0); baca7b5 against HEAD offline, alternated
#     (benchmarks/paired_h200.sh, REPEATS=1; its HEAD latency run has the fusion on).
#   PART=B (carry .gguf_parts/p2 .gguf_parts/md5 .whl .commit): join the GGUF; speculative
#     decoding (benchmarks/spec_h200.sh), beam search (benchmarks/beam_h200.sh, its GPU test
#     ran in part A), the speculative-decoding GPU tests (SmolLM2).
# Tables printed last; everything packed into $OUT/results.tgz.
set -u
out="${OUT:-out}"; mkdir -p "$out/r"
export PAGEDRT_COMMIT="$(cat .commit 2>/dev/null || echo head)"
. benchmarks/use_wheels.sh
cli="python3 -m pagedrt.entrypoints.cli"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "${PART:-A}" = C ]; then  # after A and B: the FP8 decode fix, the GPU tests A had no time
  # for, and speculation's switch-off cost at 256 requests in separate processes (spec first)
  timeout 40 $cli bench attention --kv-cache-dtype fp8 --out "$out/r/fp8attn" \
    --decode-shapes llama3-8b:64:4096,qwen2-0.5b:64:4096,qwen2-0.5b:64:2048 \
    > "$out/r/fp8attn.txt" 2>&1 || echo "fp8 attention bench failed ($?)"
  echo "== FP8 decode (V dim-major, literal strides) against bf16"; tail -5 "$out/r/fp8attn.txt"
  timeout 75 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_fused_small_batch_gpu.py tests/gpu/test_smoke_gpu.py \
    tests/gpu/test_fp8_kv_gpu.py > "$out/r/gpu_tests_c.txt" 2>&1
  echo "== GPU tests (status $?)"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/r/gpu_tests_c.txt" | tail -8
  spec='{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
  for label in on off; do
    extra=(); [ $label = on ] && extra=(--speculative-config "$spec")
    timeout 40 $cli bench throughput --preset qwen2-0.5b --num-requests 256 --input-len 128 \
      --output-len 256 --skip-step-split "${extra[@]}" --name "spec256_$label" \
      --out "$out/r/spec256" > "$out/r/spec256_$label.txt" 2>&1 || echo "spec256 $label failed ($?)"
  done
  echo "== 256 requests, qwen2-0.5b random, one process each (spec on first)"
  grep -h -E "^pagedrt" "$out/r"/spec256_*.txt | cut -c1-140
elif [ "${PART:-A}" = A ]; then
  cp .gguf_parts/p1 /tmp/p1
  timeout "${TEST_CAP:-110}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/gpu/test_tp_gpu.py tests/gpu/test_fp8_kv_gpu.py tests/gpu/test_fused_small_batch_gpu.py \
    tests/gpu/test_beam_search_gpu.py tests/gpu/test_smoke_gpu.py > "$out/r/gpu_tests.txt" 2>&1
  echo "== GPU tests (status $?)"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/r/gpu_tests.txt" | tail -8
  timeout 45 $cli bench attention --kv-cache-dtype fp8 --out "$out/r/fp8attn" \
    --decode-shapes llama3-8b:64:4096,qwen2-0.5b:64:4096,qwen2-0.5b:64:2048 \
    > "$out/r/fp8attn.txt" 2>&1 || echo "fp8 attention bench failed ($?)"
  PAGEDRT_FUSED_SMALL_BATCH=0 timeout 50 $cli bench latency --preset qwen2-0.5b \
    --name head_lat_unfused --out "$out/r/paired" > "$out/r/lat_unfused.txt" 2>&1 \
    || echo "unfused latency failed ($?)"
  BASE=.base BASE_COMMIT=baca7b5 REPEATS=1 CAP=60 OUT="$out/r/paired" \
    timeout "${PAIRED_CAP:-250}" bash benchmarks/paired_h200.sh > "$out/r/paired.txt" 2>&1
  echo "== FP8 decode (V dim-major) against bf16"; tail -8 "$out/r/fp8attn.txt"
  echo "== latency, fusion off (HEAD)"; grep -E "ctx|ms" "$out/r/lat_unfused.txt" | tail -4
  echo "== paired"; tail -8 "$out/r/paired.txt"
else
  . benchmarks/diagnostics/join_gguf.sh
  mkdir -p "$out/r/spec" "$out/r/beam"
  OUT="$out/r/spec" BUDGET_S="${SPEC_CAP:-170}" timeout "${SPEC_CAP:-170}" \
    bash benchmarks/spec_h200.sh > "$out/r/spec.txt" 2>&1
  BEAM_TESTS=0 OUT="$out/r/beam" timeout "${BEAM_CAP:-120}" bash benchmarks/beam_h200.sh \
    > "$out/r/beam.txt" 2>&1
  timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_spec_decode_gpu.py \
    > "$out/r/spec_gpu_tests.txt" 2>&1
  echo "== spec GPU tests (status $?)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/r/spec_gpu_tests.txt" | tail -6
  echo "== spec"; grep -v -i warn "$out/r/spec.txt" | tail -22
  echo "== beam"; grep -v -i warn "$out/r/beam.txt" | tail -14
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
