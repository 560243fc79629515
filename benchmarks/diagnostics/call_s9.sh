#!/usr/bin/env bash
# The device calls of 2026-12-02's second session (session 7). PART=1 (carry .base .commit
# .whl): every GPU test that needs no GGUF (HEAD's _StagingPair had not run on CUDA); the
# fixed workload's device time by kernel, baca7b5 against HEAD alternated
# (workload_kernels.py, issue 13's contested 256 x 512/128 figure); the FP8 decode kernel's
# launch settings with V token-major and dim-major (decode_tune.py) and the stripped variants
# (fp8_decode_variants.py), issue 17. Tables printed last; results packed into
# $OUT/results.tgz. PART=2 (carry .base .commit .whl): the decode kernel with literal strides
# (CONTIGUOUS) in both V layouts, the stripped variants with literal and runtime strides, FP8
# end to end with V dim-major, the FP8 and window GPU tests, the workload kernels again.
# PART=3 (carry .commit .whl): the same decode tuning and end-to-end run after the kernel
# reads FP8 bytes as uint8, and the FP8 GPU tests.
set -u
. benchmarks/diagnostics/call_common.sh
kernels() {  # tree name
  (cd "$1" && PYTHONPATH="$1:/tmp/site" timeout 120 python3 \
    "$OLDPWD/benchmarks/diagnostics/workload_kernels.py" --out "$out/r/$2.json") \
    >> "$out/r/kernels.txt" 2>&1 || echo "FAILED $2" | tee -a "$out/r/kernels.txt"
}
tune_layouts() {  # the decode kernel's launch settings, FP8 V token-major and dim-major
  timeout "$1" python3 benchmarks/decode_tune.py --out "$out/r/tune_tm" --kv-cache-dtype both \
    --small-grid --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 > "$out/r/tune_tm.txt" 2>&1
  PAGEDRT_FP8_V_DIM_MAJOR=1 timeout "$2" python3 benchmarks/decode_tune.py --out \
    "$out/r/tune_dm" --kv-cache-dtype fp8 --small-grid \
    --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 > "$out/r/tune_dm.txt" 2>&1
}
fp8_end_to_end_dm() {  # Llama-3-8B shape, FP8 (V dim-major) against bf16 on the same weights
  fp8_end_to_end_dm
}
case "${PART:-1}" in
1)
  gpu_tests gpu_tests "${TEST_CAP:-240}" tests/gpu
  base="$(realpath .base)"; head="$PWD"
  kernels "$base" k_base_1; kernels "$head" k_head_1; kernels "$head" k_head_2
  kernels "$base" k_base_2
  grep "tok/s" "$out/r/kernels.txt"
  tune_layouts 90 70
  timeout 80 python3 benchmarks/diagnostics/fp8_decode_variants.py --out "$out/r/variants" \
    > "$out/r/variants.txt" 2>&1
  python3 benchmarks/diagnostics/compare_kernels.py "$out/r" > "$out/r/compare.txt" 2>&1
  head -40 "$out/r/compare.txt"
  echo "== tune token-major"; tail -4 "$out/r/tune_tm.txt"
  echo "== tune dim-major"; tail -2 "$out/r/tune_dm.txt"
  echo "== variants"; grep -E "fp8 cvt=0" "$out/r/variants.txt" | head -16
  ;;
2)
  # issue 17: the decode kernel with literal strides (CONTIGUOUS), V token-major and dim-major
  tune_layouts 90 70
  timeout 50 python3 benchmarks/diagnostics/fp8_decode_variants.py --quick \
    --out "$out/r/variants" > "$out/r/variants.txt" 2>&1
  fp8_end_to_end_dm
  gpu_tests gpu_tests_2 "${TEST_CAP:-100}" tests/gpu/test_fp8_kv_gpu.py tests/gpu/test_window_gpu.py
  base="$(realpath .base)"; head="$PWD"
  kernels "$base" k_base_1; kernels "$head" k_head_1; kernels "$head" k_head_2
  kernels "$base" k_base_2
  python3 benchmarks/diagnostics/compare_kernels.py "$out/r" > "$out/r/compare.txt" 2>&1
  head -8 "$out/r/compare.txt"
  echo "== tune token-major"; tail -4 "$out/r/tune_tm.txt"
  echo "== tune dim-major"; tail -2 "$out/r/tune_dm.txt"
  echo "== variants"; grep -E "fp8|bf16" "$out/r/variants.txt" | head -12
  echo "== fp8 end to end (dim-major V)"; grep -iE "tok/s|blocks|fp8|auto" "$out/r/fp8kv_dm_B.txt" | tail -6
  ;;
3)
  # issue 17: the decode kernel reading an FP8 cache's bytes as uint8, both V layouts
  tune_layouts 80 60
  echo "== tune token-major"; tail -4 "$out/r/tune_tm.txt"
  echo "== tune dim-major"; tail -2 "$out/r/tune_dm.txt"
  fp8_end_to_end_dm
  echo "== fp8 end to end (dim-major V)"; grep -iE "tok/s|blocks" "$out/r/fp8kv_dm_B.txt" | tail -4
  gpu_tests gpu_tests_3 "${TEST_CAP:-70}" tests/gpu/test_fp8_kv_gpu.py
  ;;
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
