#!/usr/bin/env bash
# Device call of 2026-12-02 (carry .commit .whl; no GGUF needed).
# PART=1: the FP8 decode kernel with its products transposed (PAGEDRT_FP8_SWAP_AB=1: warpgroup
#   MMA, issue 17) against the untransposed kernel and bf16, both V layouts (decode_tune.py,
#   each config checked against the reference first; V token-major was the default then,
#   PAGEDRT_FP8_V_DIM_MAJOR=0 keeps it so since becd419); then the GPU tests not yet run on the
#   code they cover, three pytest processes at once; then `bench latency` with PDL off, on
#   (issue 16).
# The switch PAGEDRT_FP8_SWAP_AB was removed with the kernel in 3079d5f (it timed slower).
# (A PART=2 was planned for the winner; the transposed kernel lost, and call_s12.sh ran the
#   end-to-end and filter measurements instead.)
set -u
. benchmarks/diagnostics/call_common.sh
cases=llama3-8b:64:4096,qwen2-0.5b:64:4096,qwen2-0.5b:64:2048
case "${PART:-1}" in
1)
  PAGEDRT_FP8_V_DIM_MAJOR=0 PAGEDRT_FP8_SWAP_AB=1 timeout 110 python3 benchmarks/decode_tune.py --out "$out/r/tune_swap_tm" \
    --kv-cache-dtype both --small-grid --cases $cases > "$out/r/tune_swap_tm.txt" 2>&1
  PAGEDRT_FP8_SWAP_AB=1 PAGEDRT_FP8_V_DIM_MAJOR=1 timeout 70 python3 benchmarks/decode_tune.py \
    --out "$out/r/tune_swap_dm" --kv-cache-dtype fp8 --small-grid --cases $cases \
    > "$out/r/tune_swap_dm.txt" 2>&1
  PAGEDRT_FP8_V_DIM_MAJOR=0 PAGEDRT_FP8_SWAP_AB=0 timeout 70 python3 benchmarks/decode_tune.py --out "$out/r/tune_ab_tm" \
    --kv-cache-dtype fp8 --small-grid --cases $cases > "$out/r/tune_ab_tm.txt" 2>&1
  (gpu_tests gpu_a 200 tests/gpu/test_fp8_kv_gpu.py tests/gpu/test_sample_triton_gpu.py \
     > "$out/r/sum_a.txt") &
  (gpu_tests gpu_b 200 tests/gpu/test_beam_search_gpu.py tests/gpu/test_window_gpu.py \
     > "$out/r/sum_b.txt") &
  (gpu_tests gpu_c 200 tests/gpu/test_pdl_gpu.py tests/gpu/test_spec_decode_gpu.py \
     tests/gpu/test_fused_small_batch_gpu.py > "$out/r/sum_c.txt") &
  wait
  for pdl in 0 1; do
    PAGEDRT_PDL=$pdl timeout 60 python3 -m pagedrt.entrypoints.cli bench latency \
      --preset qwen2-0.5b --name "lat_pdl$pdl" --out "$out/r" >> "$out/r/lat.txt" 2>&1
  done
  cat "$out"/r/sum_*.txt
  echo "== latency (PDL 0, 1)"; grep -h "^pagedrt " "$out/r/lat.txt"
  echo "== tune: swap AB token-major (with bf16)"; grep -h "default" "$out/r/tune_swap_tm.txt" | cut -c1-150
  echo "== tune: swap AB dim-major"; grep -h "default" "$out/r/tune_swap_dm.txt" | cut -c1-150
  echo "== tune: untransposed token-major"; grep -h "default" "$out/r/tune_ab_tm.txt" | cut -c1-150
  ;;
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
