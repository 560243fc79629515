#!/usr/bin/env bash
# For the next lease (built 2026-12-06, unrun): (1) the decode kernels' GPU tests after the
# early reads' removal (`204443e`: the warp-tile kernel and paged_attention are f7a85b6's
# again); (2) PAGEDRT_RACE_COUNTER_NOISE off / on, never measured end to end (call_s98's runs
# of 2026-12-05 ran past their caps while timing kernel configs; the setting is now out of the
# config cache's fingerprint, so every process after the first reads the first's choices):
# nano-vllm's workload and 256 x 512/128 at temperature 0.6, ABBA; (3) PAGEDRT_MATMUL_NORM=1
# (the RMSNorms of 8-128 rows in the O and down projections' epilogues; no faster on the H200
# on 2026-12-04) against the default over the sweep of record on this GPU, ABAB (the setting
# is fingerprinted: its first process times its own choices). One GPU; carry .commit, .whl and
# .tcache; ~8 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests decode 170 tests/gpu/test_decode_gpu.py tests/gpu/test_pdl_early_reads_gpu.py \
  tests/gpu/test_decode_fused_reduce_gpu.py tests/gpu/test_sample_triton_gpu.py
i=0
for v in 0 1 1 0; do
  i=$((i + 1))
  bench_env "nano_${i}_$v" 170 "PAGEDRT_RACE_COUNTER_NOISE=$v" --workload nanovllm --repeats 2
done
for v in 1 0; do
  bench_env "temp06_$v" 60 "PAGEDRT_RACE_COUNTER_NOISE=$v" --sampling nanovllm --repeats 2
done
for v in 0 1 0 1; do
  [ $SECONDS -lt 520 ] || break
  sweep "norm$v" "PAGEDRT_MATMUL_NORM=$v"
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
