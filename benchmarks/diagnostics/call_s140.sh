#!/usr/bin/env bash
# The narrow matmul tiles in the decode graphs, one process (carry .commit, .whl and .tcache;
# ~4 min, either card): `benchmarks/diagnostics/matmul_graphs.py --batch-sizes 8,16,32
# --variants wide,on` with PAGEDRT_CONFIG_CACHE=off (each engine times its own choices) and
# PAGEDRT_TIMING_REP_MS=5: two engines over the same random Qwen2-0.5B weights, one whose
# candidates leave out the narrow whole-K tiles, one with today's CONFIGS; the device time of
# each N-row decode graph, the engines alternated AB BA. Everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
t0=$SECONDS
PAGEDRT_CONFIG_CACHE=off PAGEDRT_TIMING_REP_MS=5 timeout 240 python3 \
  benchmarks/diagnostics/matmul_graphs.py --batch-sizes 8,16,32 --variants wide,on \
  > "$out/r/graphs.txt" 2>&1
echo "graphs status $? in $((SECONDS - t0)) s"
grep -vE "^  \(" "$out/r/graphs.txt" | tail -12
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
