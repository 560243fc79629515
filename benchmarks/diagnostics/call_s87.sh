#!/usr/bin/env bash
# Issue 16, batches 8-128, for a lease after call_s84 (carry .commit, .whl and .tcache; ~8 min):
# the batch sweep of record with the default start-up timing, then with the in-step timing at
# the sweep's batch sizes (PAGEDRT_STEP_TIMING=8,32,64,128: the 8-128-row matmul's close configs
# timed inside whole decode graphs), then the default again (drift between runs shows); each
# run's step-timing findings are in its JSON's kernel_choices.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
sweep default1 ""
sweep step PAGEDRT_STEP_TIMING=8,32,64,128
sweep default2 ""
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
