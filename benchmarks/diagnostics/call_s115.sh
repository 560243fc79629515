#!/usr/bin/env bash
# Batch 8 and 16 through the 1-4-row kernels (issue 16): PAGEDRT_GEMV_MAX_ROWS lets the skinny
# matmul and its fused prologues (RMSNorm into QKV + RoPE and gate/up, SiLU-and-mul into down)
# serve 8 or 16 rows, where the 8-128-row tiled matmul otherwise runs. Qwen2-0.5B 512/128 at
# batch 8 (max_num_seqs 8) in ABBA order, then batch 16 A/B, then the fused small-batch GPU
# tests with 8 rows served (carry .commit, .whl and .tcache; ~6 min). Run once at 05c3e8d on
# an H100: batch 8 took 1.11 ms a decode step through the skinny kernels against 0.88 through
# the tiled matmul, so the switch was removed after it (docs/design.md, "Small-batch decode").
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
one() {  # name, rows (batch), max rows of the skinny matmul
  local t0=$SECONDS
  PAGEDRT_GEMV_MAX_ROWS=$3 timeout 110 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --num-requests "$2" --max-num-seqs "$2" --input-len 512 \
    --output-len 128 --repeats 5 --skip-step-split --name "$1" --out "$out/r" \
    > "$out/r/$1.txt" 2>&1
  echo "$1 (batch $2, GEMV_MAX_ROWS=$3) status $? in $((SECONDS - t0))s: $(grep -E \
    "^pagedrt +qwen" "$out/r/$1.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
  grep -h "decode steps\|start-up" "$out/r/$1.txt" | cut -c1-160
}
one b8_rows4_a 8 4
one b8_rows8_a 8 8
one b8_rows8_b 8 8
one b8_rows4_b 8 4
one b16_rows4 16 4
one b16_rows16 16 16
t0=$SECONDS
PAGEDRT_GEMV_MAX_ROWS=8 timeout 170 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
  tests/gpu/test_fused_small_batch_gpu.py > "$out/r/tests_rows8.txt" 2>&1
echo "fused small-batch GPU tests, GEMV_MAX_ROWS=8: status $? in $((SECONDS - t0))s"
tail -3 "$out/r/tests_rows8.txt"
