#!/usr/bin/env bash
# (A record of its run: PAGEDRT_RACE_COUNTER_NOISE was removed in a19f620, so a rerun times
# the same sampling path for both of its values.)
# PAGEDRT_SAMPLE_SPLIT (the sampler's race and greedy argmax with each row's vocabulary split
# over several programs, pagedrt/ops/sample_triton.py "Split rows") and
# PAGEDRT_RACE_COUNTER_NOISE (the race's noise drawn in registers), in one call (carry
# .commit, .whl and .tcache; ~7.5 min): (1) the sampling GPU tests, the split ones included,
# and the decode kernels' GPU tests after the early reads' removal (`204443e`, never run on a
# GPU); (2) the kernels alone (benchmarks/diagnostics/sample_kernels.py: torch.argmax against
# argmax_triton, the race unsplit against split, the noise tensor's draw and race against the
# counter-noise race, at 1-256 rows of 151,936 logits); (3) end to end, each process reading
# the first's timed kernel choices (neither switch is in the config cache's fingerprint):
# batch-1 latency (split off / on) and nano-vllm's workload (temperature 0.6, the race: both
# switches off / both on), interleaved, ABBA; then 256 x 512/128 greedy split on / off where
# time is left. Summaries last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests tests 120 tests/gpu/test_sample_triton_gpu.py tests/gpu/test_decode_gpu.py \
  tests/gpu/test_decode_fused_reduce_gpu.py tests/gpu/test_pdl_early_reads_gpu.py
timeout 60 python3 benchmarks/diagnostics/sample_kernels.py --out "$out/r/sample_kernels.json" \
  > "$out/r/sample_kernels.txt" 2>&1
echo "sample_kernels status $? at ${SECONDS}s"
i=0
for v in 0 1 1 0; do
  i=$((i + 1))
  [ $SECONDS -lt 380 ] || break
  latency_env "lat_${i}_$v" $([ $i = 1 ] && echo 120 || echo 45) "PAGEDRT_SAMPLE_SPLIT=$v"
  bench_env "nano_${i}_$v" 45 "PAGEDRT_SAMPLE_SPLIT=$v PAGEDRT_RACE_COUNTER_NOISE=$v" \
    --workload nanovllm
done
[ $SECONDS -lt 400 ] && bench_env main_1 40 "PAGEDRT_SAMPLE_SPLIT=1"
[ $SECONDS -lt 440 ] && bench_env main_0 40 "PAGEDRT_SAMPLE_SPLIT=0"
echo "== kernels alone (us; x = speed-up over the named kernel)"
grep -E " (bfloat16|float32) " "$out/r/sample_kernels.txt" | cut -c1-120
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
