#!/usr/bin/env bash
# The batch sweep of record at HEAD (fresh_seed's draws since 141280b: honest medians), then
# benchmarks/diagnostics/prefill_parts.py: the extend kernel's launch configs at the engine's
# Qwen2-0.5B prefill shape (32 x 512 tokens, 14/2 x 64; 54 configs compiled in 8 shards
# first) and the 16,384-row MLP whole against row chunks that may keep the gate/up output in
# L2 (carry .commit, .whl, .tcache; ~8.5 min). Summaries last; everything in
# $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
sweep head
prefill_parts pp 150 170
tail -22 "$out/r/pp.txt" | cut -c1-180
grep -h "output tok/s of each\|decode steps\|prefill steps" "$out/r/sweep_head.txt" | cut -c1-160
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
