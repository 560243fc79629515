#!/usr/bin/env bash
# The 16-bit warp-tile decode's split target (PAGEDRT_DECODE_PROGRAMS_PER_SM, issue 16): 4 by
# default, from kernel timings at contexts of 2,048 and more; the batch-64 decode step at
# context 512 spent 246 of 1,123 us in the attention and its reduce (call_s119). The sweep of
# record and nano-vllm's workload at 4 / 8 / 16 (ABAB, the same timed choices: the setting is
# not in the config cache's fingerprint), and the batch-64 timeline at 4 and 8. One GPU;
# carry .commit, .whl and .tcache; ~5 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
bench_env sw_p4a 170 PAGEDRT_DECODE_PROGRAMS_PER_SM=4 --batch-sizes 8,32,64,128 --repeats 2
bench_env sw_p8a 60 PAGEDRT_DECODE_PROGRAMS_PER_SM=8 --batch-sizes 8,32,64,128 --repeats 2
bench_env sw_p16a 60 PAGEDRT_DECODE_PROGRAMS_PER_SM=16 --batch-sizes 8,32,64,128 --repeats 2
bench_env sw_p4b 60 PAGEDRT_DECODE_PROGRAMS_PER_SM=4 --batch-sizes 8,32,64,128 --repeats 2
bench_env sw_p8b 60 PAGEDRT_DECODE_PROGRAMS_PER_SM=8 --batch-sizes 8,32,64,128 --repeats 2
bench_env nano_p4 60 PAGEDRT_DECODE_PROGRAMS_PER_SM=4 --workload nanovllm --repeats 2
bench_env nano_p8 60 PAGEDRT_DECODE_PROGRAMS_PER_SM=8 --workload nanovllm --repeats 2
for p in 4 8; do
  [ $SECONDS -lt 450 ] || break
  timeline_run 64 32 60 PAGEDRT_DECODE_PROGRAMS_PER_SM=$p _p$p
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
