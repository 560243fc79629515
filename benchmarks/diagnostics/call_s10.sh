#!/usr/bin/env bash
# Prepared on 2026-12-02 for the next device call (carry .commit .whl; no GGUF needed):
#   1. the GPU tests not run since their code changed: the top-k/top-p selection path at
#      Qwen2's vocabulary (test_sample_triton_gpu.py), the FP8 engine tests, TP = 1, windows;
#   2. the filter's device time, selection against the full sort (filters_gpu.py);
#   3. the FP8 decode hypotheses left (fp8_decode_variants.py --quick: seq_len from memory,
#      block masks, full tiles unmasked);
#   4. issue 16's decode-attention target on Qwen2-0.5B heads (B64 L2048, >= 3.0 TB/s): the
#      full launch grid, split counts included (decode_tune.py);
#   5. `bench throughput --sampling filters` against greedy, 3 runs each in one engine.
# Tables printed last; results packed into $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_tests "${TEST_CAP:-200}" tests/gpu/test_sample_triton_gpu.py \
  tests/gpu/test_fp8_kv_gpu.py tests/gpu/test_window_gpu.py tests/gpu/test_tp_gpu.py
timeout 60 python3 benchmarks/diagnostics/filters_gpu.py --out "$out/r/filters.json" \
  > "$out/r/filters.txt" 2>&1
timeout 70 python3 benchmarks/diagnostics/fp8_decode_variants.py --quick \
  --out "$out/r/variants" > "$out/r/variants.txt" 2>&1
timeout 150 python3 benchmarks/decode_tune.py --out "$out/r/tune_qwen" \
  --cases qwen2-0.5b:64:2048 > "$out/r/tune_qwen.txt" 2>&1
for s in greedy filters; do
  timeout 90 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
    --sampling "$s" --repeats 3 --skip-step-split --name "thr_$s" --out "$out/r" \
    > "$out/r/thr_$s.txt" 2>&1
done
echo "== filters"; cat "$out/r/filters.txt"
echo "== variants"; grep -E "fp8|bf16" "$out/r/variants.txt" | awk '{print $2,$3,$4,$6,$7,$8,$9,$10,$11}'
echo "== tune"; tail -1 "$out/r/tune_qwen.txt"
echo "== throughput"; grep -h "each run" "$out"/r/thr_*.txt
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
