#!/usr/bin/env bash
# Prepared on 2026-12-02 for the next device calls (carry .commit .whl; no GGUF needed).
# PART=1: the FP8 decode kernel with V dim-major read by full unmasked tiles (issue 17:
#   decode_tune.py both layouts, against bf16, and the Llama-3-8B end-to-end run with V
#   dim-major); the GPU tests not run since their code changed (the engine's pinned staging
#   buffers, StepBuffers: smoke, speculative decoding, beam search; FP8, the top-k/top-p
#   selection at Qwen2's vocabulary, windows).
# PART=2: the filter's device time, selection against the full sort (filters_gpu.py);
#   `bench throughput --sampling filters` against greedy, 3 runs each in one engine; issue
#   16's decode-attention target on Qwen2-0.5B heads (B64 L2048, >= 3.0 TB/s) over the full
#   launch grid, split counts included; the TP = 1 GPU test.
# PART=3: programmatic dependent launch (PAGEDRT_PDL=1, issue 16's batch-1 target): its GPU
#   test, then `bench latency` and the small-batch throughput sweep with it off and on, in
#   ABBA order.
# Tables printed last; results packed into $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
case "${PART:-1}" in
1)
  timeout 90 python3 benchmarks/decode_tune.py --out "$out/r/tune_tm" --kv-cache-dtype both \
    --small-grid --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 > "$out/r/tune_tm.txt" 2>&1
  PAGEDRT_FP8_V_DIM_MAJOR=1 timeout 70 python3 benchmarks/decode_tune.py --out \
    "$out/r/tune_dm" --kv-cache-dtype fp8 --small-grid \
    --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 > "$out/r/tune_dm.txt" 2>&1
  for layout in 0 1; do
    PAGEDRT_FP8_V_DIM_MAJOR=$layout timeout 100 python3 -m pagedrt.entrypoints.cli bench \
      throughput --preset llama3-8b --kv-cache-dtype fp8 --compare-kv-cache-dtype auto \
      --num-requests 64 --input-len 4096 --output-len 256 --max-model-len 8192 \
      --max-num-seqs 64 --gpu-memory-utilization 0.30 --skip-step-split \
      --warm-up-requests 4 --name "fp8kv_B_dm$layout" --out "$out/r" \
      > "$out/r/fp8kv_B_dm$layout.txt" 2>&1
  done
  gpu_tests gpu_tests "${TEST_CAP:-180}" tests/gpu/test_smoke_gpu.py \
    tests/gpu/test_spec_decode_gpu.py tests/gpu/test_beam_search_gpu.py \
    tests/gpu/test_fp8_kv_gpu.py tests/gpu/test_sample_triton_gpu.py tests/gpu/test_window_gpu.py
  echo "== tune token-major"; tail -4 "$out/r/tune_tm.txt"
  echo "== tune dim-major"; tail -2 "$out/r/tune_dm.txt"
  echo "== end to end"; grep -h "fp8_e4m3 / bfloat16" "$out"/r/fp8kv_B_dm*.txt
  ;;
2)
  timeout 60 python3 benchmarks/diagnostics/filters_gpu.py --out "$out/r/filters.json" \
    > "$out/r/filters.txt" 2>&1
  for s in greedy filters; do
    timeout 90 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
      --sampling "$s" --repeats 3 --skip-step-split --name "thr_$s" --out "$out/r" \
      > "$out/r/thr_$s.txt" 2>&1
  done
  timeout 150 python3 benchmarks/decode_tune.py --out "$out/r/tune_qwen" \
    --cases qwen2-0.5b:64:2048 > "$out/r/tune_qwen.txt" 2>&1
  gpu_tests gpu_tests_tp "${TEST_CAP:-120}" tests/gpu/test_tp_gpu.py
  echo "== filters"; cat "$out/r/filters.txt"
  echo "== throughput"; grep -h "each run" "$out"/r/thr_*.txt
  echo "== tune"; tail -1 "$out/r/tune_qwen.txt"
  ;;
3)
  gpu_tests gpu_tests_pdl "${TEST_CAP:-90}" tests/gpu/test_pdl_gpu.py
  i=0
  for pdl in 0 1 1 0; do
    i=$((i + 1))
    PAGEDRT_PDL=$pdl timeout 90 python3 -m pagedrt.entrypoints.cli bench latency \
      --preset qwen2-0.5b --name "lat_${i}_pdl$pdl" --out "$out/r" >> "$out/r/lat.txt" 2>&1
  done
  for pdl in 0 1; do
    PAGEDRT_PDL=$pdl timeout 120 python3 -m pagedrt.entrypoints.cli bench throughput \
      --preset qwen2-0.5b --batch-sizes 1,8,32,64 --skip-step-split --name "thr_pdl$pdl" \
      --out "$out/r" > "$out/r/thr_pdl$pdl.txt" 2>&1
  done
  echo "== latency (PDL 0, 1, 1, 0)"; grep -h "^pagedrt " "$out/r/lat.txt"
  echo "== throughput by batch"; grep -h "pagedrt " "$out"/r/thr_pdl*.txt | head -12
  ;;
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
