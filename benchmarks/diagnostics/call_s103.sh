#!/usr/bin/env bash
# Every GPU test in one call, then the Triton cache back (carry .commit, .whl and .tcache;
# ~9 min): `pytest -m gpu tests/gpu` over four pytest processes at once (gpu_tests_sharded,
# 420 s caps, leaving the save room in a call's 600 s: with 470 s it did not fit on
# 2026-12-06), then save_triton_cache ($OUT/tc.txz.NN: put them in .tcache/). On 2026-12-05
# (22:10 UTC, one H100) the in-step timing's engine test and spec decode's were still cut by
# their caps compiling, and the tp worker test's replay counter missed the staged replays
# (mended in 52bfea6); run this twice on one lease (the second finds the first's kernels) or
# carry the cache it returns to the next lease.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests_sharded gpu 420 4 tests/gpu
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
