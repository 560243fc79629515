#!/usr/bin/env bash
# For the next lease (built 2026-12-06, unrun): the decode attention at the 256-row step, issue
# 16's largest item there. On an H100 the 256 x 512/128 decode step spent 779 of 2,091 us in
# `_decode_kernel` (unsplit, 128/4/3 at Qwen2-0.5B's heads; 75.5 MB of K/V a layer at ~576
# tokens of context, 2.3 TB/s; benchmarks/results/s30call2_50b2b2c/tl_b256.txt), and the
# kernel-level sweeps behind its launch were at B64 and longer contexts. decode_tune.py over
# B256 and B128 at 576 tokens: BLOCK_N 64/128/256 x 2/4/8 warps x 2-5 stages x 1-2 splits x
# `_decode_kernel` or warp tiles of 1 or 2 KV heads, compiled in 8 shards, then timed in one
# process, each setting checked against the reference first. One GPU; carry .commit, .whl
# and .tcache; ~6 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
tune b256 --cases qwen2-0.5b:256:576,qwen2-0.5b:128:576 --block-n 64,128,256 --warps 2,4,8 \
  --stages 2,3,4,5 --splits 1,2 --warp-tiles 0,1,2
echo "tune status: $(tail -3 "$out/r/tune_b256.txt")"
grep -E "best|default" "$out/r/tune_b256.txt" | head -12
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
