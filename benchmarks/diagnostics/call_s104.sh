#!/usr/bin/env bash
# The decode attention's launch at the 256-row step's shapes (carry .commit, .whl, .tcache;
# ~6 min): at Qwen2-0.5B's 256 x 512/128 the `_decode_kernel` took 802 us of a 2.09 ms decode
# step on an H100 (2026-12-05 22:00, tl_b256: 75.5 MB a layer at 2.3 TB/s). Its default
# launch there (BLOCK_N 128, 4 warps, 3 stages, unsplit) buffers 32 KB of K and V a stage,
# so few programs share an SM at 512 programs for 132 SMs; smaller tiles fit more.
# `decode_tune.py`, bf16, every setting checked against the reference first, over BLOCK_N
# 32/64/128, 2/4/8 warps, 2/3/4 stages, 1 or 2 splits, `_decode_kernel` and the warp tiles,
# at B256 L512 / L640 and B128 L640. Prints each case's default time and the fastest
# settings; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
tune b256 --cases qwen2-0.5b:256:512,qwen2-0.5b:256:640,qwen2-0.5b:128:640 \
  --kv-cache-dtype auto --block-n 32,64,128 --warps 2,4,8 --stages 2,3,4 --splits 1,2 \
  --warp-tiles 0,1
grep -v "^ *$" "$out/r/tune_b256.txt" | tail -30 | cut -c1-160
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
