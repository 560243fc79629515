#!/usr/bin/env bash
# Session of 2026-12-02 (08:30 UTC), calls 3-5, made right after each other: each carries one
# part of the SmolLM2 GGUF (.gguf_parts/pN, copied to /tmp; the last joins them) besides
# .commit and .whl.
# PART=1: the FP8-product decode kernel (PAGEDRT_FP8_MMA=1: query and probabilities in e4m3,
#   products transposed so Triton emits Hopper's FP8 wgmma m64n16k32, no e4m3 -> fp16
#   conversions) against the default FP8 kernel, decode_tune on both head shapes (compiled in 8
#   shards first), with each setting's error against the reference in the JSON.
# PART=2: issue 17's end-to-end examples not yet run: Llama-3-8B shape (random weights),
#   64 x 8192 / 512 and 256 x 4096 / 256, FP8 cache against bf16 in one process each.
# PART=3: join the GGUF; real SmolLM2 accuracy (perplexity, greedy agreement) of the FP8 cache
#   under the default kernel and under PAGEDRT_FP8_MMA=1, on the GPU's Triton kernels; the FP8
#   GPU tests.
set -u
. benchmarks/diagnostics/call_common.sh
cp .gguf_parts/p[0-9] /tmp/ 2>/dev/null
case "${PART:-1}" in
1)
GRID="--kv-cache-dtype fp8 --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 --block-n 64,128 --warps 4,8 --stages 2,3 --splits 1,2 --maxnreg 0,128"
PAGEDRT_FP8_MMA=1 tune fp8mma $GRID
tune fp8 $GRID --maxnreg 128
echo "== decode kernel (fp8mma first)"; grep -h "default" "$out"/r/tune_fp8mma.txt "$out"/r/tune_fp8.txt | cut -c1-250
python3 - "$out/r" <<'PY'
import json, sys
for name in ("fp8mma", "fp8"):
    for r in json.load(open(f"{sys.argv[1]}/tune_{name}/decode_tune.json"))["results"]:
        errs = [t["error"] for t in r["timings"]]
        print(name, r["model"], "max |error| over settings", max(errs) if errs else None,
              "bad", len(r["bad"]))
PY
;;
2)
for shape in "64 8192 512" "256 4096 256"; do
  set -- $shape
  timeout 280 python3 -m pagedrt.entrypoints.cli bench throughput --preset llama3-8b \
    --kv-cache-dtype fp8 --compare-kv-cache-dtype auto --num-requests $1 --input-len $2 \
    --output-len $3 --max-model-len $(( $2 + $3 + 16 )) --max-num-seqs $1 \
    --gpu-memory-utilization 0.30 --skip-step-split --warm-up-requests 4 \
    --name "fp8kv_$1x$2" --out "$out/r" > "$out/r/fp8kv_$1x$2.txt" 2>&1
done
echo "== fp8 end to end"; grep -h "fp8_e4m3 / bfloat16\|KV cache\|^pagedrt " "$out"/r/fp8kv_*.txt
;;
3)
. benchmarks/diagnostics/join_gguf.sh
for mma in 0 1; do
  PAGEDRT_FP8_MMA=$mma timeout 150 python3 -m pagedrt.entrypoints.cli bench accuracy \
    --model "$SMOLLM2_GGUF" --dtype bfloat16 --kv-cache-dtype fp8 --name "acc_mma$mma" \
    --perplexity-chunk 1 \
    --out "$out/r" > "$out/r/acc_mma$mma.txt" 2>&1
done
gpu_tests gpu_fp8 150 tests/gpu/test_fp8_kv_gpu.py
PAGEDRT_FP8_MMA=1 gpu_tests gpu_fp8_mma 150 tests/gpu/test_fp8_kv_gpu.py
echo "== accuracy (FP8 products off, on)"; for mma in 0 1; do tail -6 "$out/r/acc_mma$mma.txt"; done
;;
esac
rm -rf "$out"/r/shard_*
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
