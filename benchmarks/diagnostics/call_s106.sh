#!/usr/bin/env bash
# The batch sweep of record at HEAD with fresh_seed's draws (141280b: no run hits the prefix
# cache, so the repeats' medians are honest), then call_s104's decode-attention tune at the
# 256-row step's shapes, B128 left out to fit one call (carry .commit, .whl, .tcache;
# ~9.5 min). Summary lines and the tune's table last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
sweep head
tune b256 --cases qwen2-0.5b:256:512,qwen2-0.5b:256:640 \
  --kv-cache-dtype auto --block-n 32,64,128 --warps 2,4,8 --stages 2,3,4 --splits 1,2 \
  --warp-tiles 0,1
grep -v "^ *$" "$out/r/tune_b256.txt" | tail -24 | cut -c1-160
grep -h "output_tok_s_runs\|tok/s" "$out/r/sweep_head.txt" | tail -8 | cut -c1-200
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
