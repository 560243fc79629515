#!/usr/bin/env bash
# Every GPU test in one call (carry .commit, .whl and .tcache; ~9 min): `pytest -m gpu
# tests/gpu` dealt over four pytest processes at once (gpu_tests_sharded, 480 s caps). On
# 2026-12-05 (17:11-17:43 UTC, one H100) three calls ran every file but tp under the staged
# default: 175 of 184 passed; the matmul engine test's stub and the counters test's message
# were stale (mended: 1a0c1f0, 36993fa), and the in-step timing's 8/16-row engine test ran past
# 300 s (max_num_seqs 16 since 36993fa). This call checks those mends with everything else.
# The two-GPU tests skip on one GPU. Shard summaries last; every shard's output in
# $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests_sharded gpu 480 4 tests/gpu
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
