#!/usr/bin/env bash
# Prepared 2026-12-03 07:10 UTC for the next lease (carry .commit and .whl; ~7 min; after
# call_s40). The warp-tile kernel over several KV heads per program (launch config
# warp_tiles N: one program reads a token's rows of N heads together, 128 bytes at
# Qwen2-0.5B's FP8 head_dim 64 instead of two 64-byte halves read by two programs), against
# N = 1, the default, at Qwen2-0.5B and Llama-3-8B heads; splits over the halved programs.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests fp8 240 tests/gpu/test_fp8_kv_gpu.py -k decode_launches
tune kvh --kv-cache-dtype fp8 \
  --cases qwen2-0.5b:64:4096,qwen2-0.5b:16:16384,qwen2-0.5b:64:2048,llama3-8b:64:4096 \
  --block-n 32,64 --warps 1,2 --stages 4,5 --splits 0,4,8,16 --warp-tiles 1,2
echo "== tune kvh"; grep -E "^(llama|qwen)" "$out/r/tune_kvh.txt" | cut -c1-330
# issue 16's >= 3.0 TB/s at Qwen2-0.5B heads B64 L2048 over bf16 (2.75-2.79 with
# _decode_kernel): the warp tiles at one warp, which call_s34 did not try over bf16
tune bfw --kv-cache-dtype auto --cases qwen2-0.5b:64:2048,qwen2-0.5b:64:4096 \
  --block-n 32,64 --warps 1,2 --stages 3,4,5 --splits 0,4,8 --warp-tiles 0,1
echo "== tune bfw"; grep -E "^(llama|qwen)" "$out/r/tune_bfw.txt" | cut -c1-330
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
