#!/usr/bin/env bash
# PAGEDRT_SAMPLE_SPLIT alone on nano-vllm's workload (temperature 0.6, the race over the noise
# tensor), after call_s127.sh found PAGEDRT_RACE_COUNTER_NOISE slower at the kernel level and
# its nano-vllm pair (both switches together) level, and its first split run slowed by the
# split kernels compiling inside the timed run (carry .commit, .whl and .tcache; ~3.5 min):
# one process split off (it times the kernel configs), one split on (compiles the split
# kernels; not counted), then off / on / on / off, then 256 x 512/128 greedy on / off.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
bench_env nano_warm0 120 "PAGEDRT_SAMPLE_SPLIT=0" --workload nanovllm
bench_env nano_warm1 40 "PAGEDRT_SAMPLE_SPLIT=1" --workload nanovllm
i=0
for v in 0 1 1 0; do
  i=$((i + 1))
  [ $SECONDS -lt 190 ] || break
  bench_env "nano_${i}_$v" 30 "PAGEDRT_SAMPLE_SPLIT=$v" --workload nanovllm
done
for v in 1 0; do
  [ $SECONDS -lt 220 ] || break
  bench_env "main_$v" 30 "PAGEDRT_SAMPLE_SPLIT=$v"
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
