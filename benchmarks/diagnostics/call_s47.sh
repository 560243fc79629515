#!/usr/bin/env bash
# 2026-12-03 17:50 UTC (carry .commit and .whl; ~9 min). The split-K reduce with several query
# heads per program (reduce_heads_per_program: at most one program per SM, so that they all
# wait beside the split kernel under PDL) and the warp tiles as the 16-bit default at
# head_dim 64: GPU tests of the decode paths; each reduce setting against the reduce of one
# head per program (the old one) on both caches; the new bf16 default against the old
# `_decode_kernel` launch; issue 17's decode figures (bench attention); batch-1 latency with
# the contexts in the other order (FP8 at ctx 512 came out slower than at 4096 in call_s46);
# batch 8 end to end with a warm-up as long as the workload.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests dec 300 tests/gpu/test_decode_gpu.py tests/gpu/test_decode_fused_reduce_gpu.py \
  tests/gpu/test_pdl_gpu.py tests/gpu/test_fused_small_batch_gpu.py
gpu_tests fp8 150 tests/gpu/test_fp8_kv_gpu.py -k "decode_launches or engine_on_gpu"
tune rh8 --kv-cache-dtype fp8 --default-only --reduce-heads 0,1,2,4,8,16 \
  --cases qwen2-0.5b:64:4096,qwen2-0.5b:16:16384,llama3-8b:8:32768,qwen2-0.5b:1:4096,qwen2-0.5b:8:4096
echo "== tune rh8"; grep -E "^(llama|qwen)" "$out/r/tune_rh8.txt" | cut -c1-330
tune b16 --kv-cache-dtype auto --block-n 128 --warps 4 --stages 3 --splits 0 --warp-tiles 0 \
  --reduce-heads 0,1 --cases qwen2-0.5b:1:512,qwen2-0.5b:1:4096,qwen2-0.5b:8:4096,\
qwen2-0.5b:64:2048,qwen2-0.5b:64:4096,qwen2-0.5b:256:640,qwen2-0.5b:16:16384,llama3-8b:8:32768
echo "== tune b16"; grep -E "^(llama|qwen)" "$out/r/tune_b16.txt" | cut -c1-330
OUT="$out/r/fp8kv" FP8KV_STEPS=attention bash benchmarks/fp8kv_h200.sh | tail -7
cli="python3 -m pagedrt.entrypoints.cli bench"
for dt in fp8 auto; do
  timeout 100 $cli latency --preset qwen2-0.5b --kv-cache-dtype $dt --contexts 4096,512,512 \
    --num-tokens 64 --graphs on --name lat_$dt --out "$out/r" > "$out/r/lat_$dt.txt" 2>&1
  echo "== latency qwen2-0.5b $dt (status $?)"; grep pagedrt "$out/r/lat_$dt.txt"
done
timeout 240 $cli throughput --preset llama3-8b --kv-cache-dtype fp8 --compare-kv-cache-dtype auto \
  --num-requests 8 --input-len 4096 --output-len 256 --max-model-len 8192 --max-num-seqs 8 \
  --gpu-memory-utilization 0.30 --skip-step-split --warm-up-requests 8 --name b8w \
  --out "$out/r" > "$out/r/b8w.txt" 2>&1
echo "== b8w (status $?)"; grep -h "^pagedrt KV\|fp8_e4m3 / bfloat16\|decode steps" "$out/r/b8w.txt"
timeout 100 $cli throughput --preset qwen2-0.5b --name q256 --out "$out/r" > "$out/r/q256.txt" 2>&1
echo "== q256 (status $?)"; grep -E "^pagedrt|decode steps" "$out/r/q256.txt" | head -4
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
