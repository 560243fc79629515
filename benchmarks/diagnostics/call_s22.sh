#!/usr/bin/env bash
# 2026-12-02 13:20 UTC: FP8 extend launch config 128/64/8/3 (call_s21's sweep); the issue's two
# long-context workloads, Llama-3-8B shape, FP8 against bf16 in one process each:
# 256 x 4,096 / 256 (0.69x at 065549c with the old config), 64 x 7,680 / 512; then the FP8
# attention GPU tests at the new config. Carry .commit and .whl.
set -u
. benchmarks/diagnostics/call_common.sh
thr() {  # name, requests, input, output, max model len
  timeout 250 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset llama3-8b --kv-cache-dtype fp8 --compare-kv-cache-dtype auto --num-requests "$2" \
    --input-len "$3" --output-len "$4" --max-model-len "$5" --max-num-seqs 256 \
    --gpu-memory-utilization 0.30 --skip-step-split --warm-up-requests 4 --name "$1" \
    --out "$out/r" > "$out/r/$1.txt" 2>&1
  grep -h "^pagedrt KV\|fp8_e4m3 / bfloat16\|prefill steps\|decode steps" "$out/r/$1.txt"
}
thr fp8kv_256 256 4096 256 4368
thr fp8kv_64 64 7680 512 8192
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_fp8_kv_gpu.py \
  -k "written_rows or matches_reference" > "$out/r/gpu_fp8.txt" 2>&1
echo "== gpu tests (status $?)"; tail -2 "$out/r/gpu_fp8.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
