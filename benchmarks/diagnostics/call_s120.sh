#!/usr/bin/env bash
# A split decode's shortest partition (PAGEDRT_DECODE_MIN_PART, issue 16): its GPU tests, then
# Qwen2-0.5B batch-1 latency at floors 0 (one tile, today), 64, 128 and 256 in ABAB order, the
# 64 x 512/128 workload with batches 8 and 32 at floors 0 / 128 / 256, and the batch-8 decode
# timeline at 0 and 128 (the attention and its reduce took 168 of 926 us a step at batch 8 in
# call_s119). One GPU; carry .commit, .whl and .tcache; ~7 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests tests 200 tests/gpu/test_decode_min_partition_gpu.py tests/gpu/test_decode_gpu.py
latency_env lat_mp0a 150 PAGEDRT_DECODE_MIN_PART=0
latency_env lat_mp128a 70 PAGEDRT_DECODE_MIN_PART=128
latency_env lat_mp256a 70 PAGEDRT_DECODE_MIN_PART=256
latency_env lat_mp64a 70 PAGEDRT_DECODE_MIN_PART=64
latency_env lat_mp0b 70 PAGEDRT_DECODE_MIN_PART=0
latency_env lat_mp128b 70 PAGEDRT_DECODE_MIN_PART=128
latency_env lat_mp256b 70 PAGEDRT_DECODE_MIN_PART=256
latency_env lat_mp64b 70 PAGEDRT_DECODE_MIN_PART=64
bench_env sw_mp0 120 PAGEDRT_DECODE_MIN_PART=0 --num-requests 64 --max-num-seqs 64 \
  --batch-sizes 8,32 --repeats 2
bench_env sw_mp128 80 PAGEDRT_DECODE_MIN_PART=128 --num-requests 64 --max-num-seqs 64 \
  --batch-sizes 8,32 --repeats 2
bench_env sw_mp256 80 PAGEDRT_DECODE_MIN_PART=256 --num-requests 64 --max-num-seqs 64 \
  --batch-sizes 8,32 --repeats 2
bench_env sw_mp0b 80 PAGEDRT_DECODE_MIN_PART=0 --num-requests 64 --max-num-seqs 64 \
  --batch-sizes 8,32 --repeats 2
for mp in 0 128; do
  [ $SECONDS -lt 500 ] || break
  timeline_run 8 32 80 PAGEDRT_DECODE_MIN_PART=$mp _mp$mp
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
