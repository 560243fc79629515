#!/usr/bin/env bash
# Prepared on 2026-12-02 for the next device calls (carry .commit .whl; no GGUF needed).
# PART=1: the FP8 decode kernel with V dim-major read by full unmasked tiles (issue 17:
#   decode_tune.py both layouts, against bf16, and the Llama-3-8B end-to-end run with V
#   dim-major); the GPU tests not run since their code changed (the engine's pinned staging
#   buffers, StepBuffers: smoke, speculative decoding, beam search; FP8, the top-k/top-p
#   selection at Qwen2's vocabulary, windows).
# (PART=2 and 3, prepared here, were superseded by call_s12.sh and call_s13.sh, which ran
#   their measurements; only PART=1 ran from this script, on 2026-12-02 at bb54e67.)
# Tables printed last; results packed into $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
case "${PART:-1}" in
1)
  # V token-major was the default when this ran; it is dim-major since becd419
  PAGEDRT_FP8_V_DIM_MAJOR=0 timeout 90 python3 benchmarks/decode_tune.py --out "$out/r/tune_tm" \
    --kv-cache-dtype both \
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
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
