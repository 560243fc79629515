#!/usr/bin/env bash
# Packed KV heads in the warp-tile decode (config kv_heads_per_program: a program reads PACK
# KV heads, their query rows packed into one 16-row operand; attention_decode_warp_triton's
# module doc), one call on either card (carry .commit, .whl and .tcache; ~7 min):
# 1. the GPU tests of the packed launches (tests/gpu/test_decode_gpu.py -k packed, and
#    test_fp8_kv_gpu.py -k decode_launches), capped at TESTS_CAP (default 150 s);
# 2. decode_tune over both caches at Qwen2-0.5B heads (14/2 x 64): issue 17's shapes (B64
#    L4096, B16 L16384), issue 16's (B64 L2048, the 256-row decode at 640 and 1,100 tokens,
#    batch 8 and 1), PACK 1 and 2, tiles 32/64 x 1/2 warps x stages 4/5, the launch's splits;
#    compiled in 8 shards, then timed in one process;
# 3. tests/gpu/test_token_controls_gpu.py (bad words among them), capped at CONTROLS_CAP.
# Results in $OUT/results.tgz; the two tables printed last.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests packed "${TESTS_CAP:-150}" tests/gpu/test_decode_gpu.py::test_packed_kv_heads_match_reference \
  tests/gpu/test_fp8_kv_gpu.py::test_fp8_decode_launches_on_gpu_match_reference
CASES=${CASES:-qwen2-0.5b:64:4096,qwen2-0.5b:16:16384,qwen2-0.5b:64:2048,qwen2-0.5b:256:640,qwen2-0.5b:256:1100,qwen2-0.5b:8:4096,qwen2-0.5b:1:4096}
t0=$SECONDS
tune pack --cases "$CASES" --kv-cache-dtype both --block-n 32,64 --warps 1,2 --stages 4,5 \
  --splits 0 --warp-tiles 1 --kv-heads-per-program 1,2
echo "tune status $? in $((SECONDS - t0)) s"
# bad words (and the other token controls) on CUDA against the CPU engine
gpu_tests controls "${CONTROLS_CAP:-120}" tests/gpu/test_token_controls_gpu.py
[ -d .tcache ] || save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && cp "$out/r/tune_pack.txt" "$out/" && rm -rf "$out/r" \
  && mv /tmp/results.tgz "$out/"
grep -E "default|no setting" "$out/tune_pack.txt" | tail -14
echo "call done at ${SECONDS}s"
