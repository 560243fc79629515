#!/usr/bin/env bash
# PAGEDRT_SAMPLE_SPLIT, second call, right after call_s127.sh on the same machine (carry
# .commit, .whl and .tcache; ~8 min): nano-vllm's workload (temperature 0.6, the race) over
# PAGEDRT_RACE_COUNTER_NOISE x PAGEDRT_SAMPLE_SPLIT, each of the four settings twice in
# ABCDDCBA order, one process a run (neither switch is in the config cache's fingerprint, so
# every process reads the same timed kernel choices); then the batch sweep of record, split
# off / on. Summaries last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
i=0
for nv in 00 10 01 11 11 01 10 00; do
  i=$((i + 1))
  [ $SECONDS -lt 330 ] || break
  bench_env "nano_${i}_n${nv:0:1}s${nv:1:1}" 60 \
    "PAGEDRT_RACE_COUNTER_NOISE=${nv:0:1} PAGEDRT_SAMPLE_SPLIT=${nv:1:1}" --workload nanovllm
done
for v in 0 1; do
  [ $SECONDS -lt 450 ] || break
  sweep "s$v" "PAGEDRT_SAMPLE_SPLIT=$v"
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
