#!/usr/bin/env bash
# Prepared on 2026-12-02 (09:20 UTC), revised at 12:10 UTC for FRESH_CHUNK_KV (a prefill over
# an FP8 cache reads its own K/V from the rows the writer rounded, not from the cache).
# Carry .commit, .whl and the GGUF parts over three calls made right after each other
# (PART=1 with .gguf_parts/p1, PART=2 with p2, PART=3 with p3 and md5), as call_s17.sh.
# PART=1 (~4 min): the FP8 GPU tests (the rows read by the prefill, the opt-in FP8-product
#   prefill); the extend kernel over an FP8 cache, as the engine prefills a prompt and with
#   every key from the cache, with and without PAGEDRT_FP8_PREFILL_MMA=1, against bf16
#   (`pagedrt bench attention --kv-cache-dtype fp8`, its 4096-token prefill row); the
#   sampler's candidates-only draw (`filters_candidates.py`, full rows against candidates).
# PART=2 (~6 min): Qwen2-0.5B 256 x 512/128 greedy and with filters, medians of 3 (the
#   filters' decode step was 3.44 ms against greedy's 1.87 before the candidates-only draw);
#   Llama-3-8B 256 x 4,096 / 256 FP8 against bf16 (0.83x before FRESH_CHUNK_KV,
#   benchmarks/results/RUNS.md, 08:30 runs).
# PART=3 (~6 min): real SmolLM2 accuracy of the FP8 cache, chunked prefill (the extend
#   kernel), with and without PAGEDRT_FP8_PREFILL_MMA=1; Llama-3-8B 64 x 7,680 / 512 FP8
#   against bf16 (the 64 x 8,192 / 512 within the preset's 8,192 positions).
set -u
. benchmarks/diagnostics/call_common.sh
cp .gguf_parts/p[0-9] /tmp/ 2>/dev/null
case "${PART:-1}" in
1)
gpu_tests gpu_fp8 170 tests/gpu/test_fp8_kv_gpu.py
for mma in 0 1; do
  PAGEDRT_FP8_PREFILL_MMA=$mma timeout 60 python3 -m pagedrt.entrypoints.cli bench attention \
    --kv-cache-dtype fp8 --decode-shapes llama3-8b:64:4096 \
    --out "$out/r/att_mma$mma" > "$out/r/att_mma$mma.txt" 2>&1
done
timeout 60 python3 benchmarks/diagnostics/filters_candidates.py > "$out/r/filters.txt" 2>&1
echo "== extend over FP8 (FP8 products off, on)"; grep -h "over FP8" "$out"/r/att_mma*.txt | head -4
cat "$out/r/filters.txt"
;;
2)
for s in greedy filters; do
  timeout 90 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
    --sampling "$s" --repeats 3 --skip-step-split --name "thr_$s" --out "$out/r" \
    > "$out/r/thr_$s.txt" 2>&1
done
timeout 240 python3 -m pagedrt.entrypoints.cli bench throughput \
  --preset llama3-8b --kv-cache-dtype fp8 --compare-kv-cache-dtype auto --num-requests 256 \
  --input-len 4096 --output-len 256 --max-model-len 4368 --max-num-seqs 256 \
  --gpu-memory-utilization 0.30 --skip-step-split --warm-up-requests 4 --name fp8kv_256 \
  --out "$out/r" > "$out/r/fp8kv_256.txt" 2>&1
grep -h "^pagedrt \|fp8_e4m3 / bfloat16" "$out"/r/thr_*.txt "$out/r/fp8kv_256.txt"
;;
3)
. benchmarks/diagnostics/join_gguf.sh
for mma in 0 1; do
  PAGEDRT_FP8_PREFILL_MMA=$mma timeout 100 python3 -m pagedrt.entrypoints.cli bench accuracy \
    --model "$SMOLLM2_GGUF" --dtype bfloat16 --kv-cache-dtype fp8 --name "acc_prefill_mma$mma" \
    --out "$out/r" > "$out/r/acc_mma$mma.txt" 2>&1
  tail -4 "$out/r/acc_mma$mma.txt"
done
timeout 240 python3 -m pagedrt.entrypoints.cli bench throughput \
  --preset llama3-8b --kv-cache-dtype fp8 --compare-kv-cache-dtype auto --num-requests 64 \
  --input-len 7680 --output-len 512 --max-model-len 8192 --max-num-seqs 64 \
  --gpu-memory-utilization 0.30 --skip-step-split --warm-up-requests 2 --name fp8kv_64 \
  --out "$out/r" > "$out/r/fp8kv_64.txt" 2>&1
grep -h "^pagedrt \|fp8_e4m3 / bfloat16" "$out/r/fp8kv_64.txt"
;;
esac
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
