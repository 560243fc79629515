#!/usr/bin/env bash
# The early reads measured as they stood at 4defdad-e7c21f2 (its early-read GPU test, batch-1
# latency with PAGEDRT_DECODE_EARLY=1 against 0 and over FP8 all against 1, 64 x 512/128 with
# batches 8 and 32), with caps for a tree whose timed choices are not yet on disk (the first
# latency run of each cache dtype times them, ~80 s; PAGEDRT_DECODE_EARLY is no longer in the
# config cache's fingerprint, so its A/B runs share those choices), plus the batch-1 host
# profile (batch1_steps.py --profile: the lent host's step function by function). One GPU;
# carry .commit, .whl and .tcache; ~9 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
t0=$SECONDS
timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
  tests/gpu/test_pdl_early_reads_gpu.py > "$out/r/tests.txt" 2>&1
echo "early-read GPU tests status $? in $((SECONDS - t0))s: $(tail -1 "$out/r/tests.txt")"
latency_env lat_on1 170 PAGEDRT_DECODE_EARLY=1
latency_env lat_off1 70 PAGEDRT_DECODE_EARLY=0
latency_env lat_off2 70 PAGEDRT_DECODE_EARLY=0
latency_env lat_on2 70 PAGEDRT_DECODE_EARLY=1
latency_env lat_fp8_all1 150 PAGEDRT_DECODE_EARLY=all --kv-cache-dtype fp8
latency_env lat_fp8_16bit1 70 PAGEDRT_DECODE_EARLY=1 --kv-cache-dtype fp8
latency_env lat_fp8_16bit2 70 PAGEDRT_DECODE_EARLY=1 --kv-cache-dtype fp8
latency_env lat_fp8_all2 70 PAGEDRT_DECODE_EARLY=all --kv-cache-dtype fp8
t1=$SECONDS
timeout 90 python3 benchmarks/diagnostics/batch1_steps.py --runs 3 --steps 128 \
  --profile "$out/r/b1_profile.txt" > "$out/r/b1_steps.txt" 2>&1
echo "batch1_steps status $? in $((SECONDS - t1))s"; grep -E "^run|ms/step|^profiled" "$out/r/b1_steps.txt" | head -12
[ $SECONDS -lt 420 ] && bench_env sw_on 100 PAGEDRT_DECODE_EARLY=1 --num-requests 64 --max-num-seqs 64 \
  --batch-sizes 8,32 --repeats 2
[ $SECONDS -lt 480 ] && bench_env sw_off 80 PAGEDRT_DECODE_EARLY=0 --num-requests 64 --max-num-seqs 64 \
  --batch-sizes 8,32 --repeats 2
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
