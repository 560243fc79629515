#!/usr/bin/env bash
# 2026-12-06, an H100 (no H200 came): the GPU tests of the kernels this session changed (the
# sampler's race after PAGEDRT_RACE_COUNTER_NOISE's removal, `a19f620`; the decode attention
# after its fused reduce's and block-table prefetch's removal, `ece57f4`; the split-K matmul
# after the norm epilogue's removal and the counters' move, `183b1b0`; FP8 and window decode)
# in 3 shards, then, where time is left, call_s126.sh's sweep of the decode attention at the 256-row step
# (decode_tune.py over Qwen2-0.5B heads B256 and B128 at 576 tokens: BLOCK_N 64/128/256 x
# 2/4/8 warps x 2-5 stages x 1-2 splits x `_decode_kernel` or warp tiles of 1 or 2 KV heads).
# One GPU; carry .commit, .whl and .tcache; ~7 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests_sharded kern 200 3 tests/gpu/test_sample_triton_gpu.py tests/gpu/test_matmul_gpu.py \
  tests/gpu/test_decode_gpu.py tests/gpu/test_pdl_early_reads_gpu.py tests/gpu/test_fp8_kv_gpu.py \
  tests/gpu/test_window_gpu.py
[ $SECONDS -lt 330 ] || { tar -czf /tmp/results.tgz -C "$out" r && mv /tmp/results.tgz "$out/"; exit 0; }
tune b256 --cases qwen2-0.5b:256:576,qwen2-0.5b:128:576 --block-n 64,128,256 --warps 2,4,8 \
  --stages 2,3,4,5 --splits 1,2 --warp-tiles 0,1,2
echo "tune status: $(tail -3 "$out/r/tune_b256.txt")"
grep -E "best|default" "$out/r/tune_b256.txt" | head -12
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
