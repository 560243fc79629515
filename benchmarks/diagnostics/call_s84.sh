#!/usr/bin/env bash
# Issue 16, batch 1, for the next lease (carry .commit and .whl, and .tcache when a call has
# saved one; ~9.5 min): which chooser of the batch-1 tiles gives the fastest steps? Batch-1
# latency at ctx 512 / 4,096 from fresh engines: the default start-up timing, the in-step
# timing (PAGEDRT_STEP_TIMING=1: close configs of each one-row op timed inside whole batch-1
# decode graphs) and the PDL lead (PAGEDRT_TIMING_LEAD=1), alternating (the first run pays the
# compiles); each run's 1-row choices printed; then the Triton cache saved for the next call
# (save_triton_cache). call_s82 measured 0.608 / 0.651 ms with gate/up (16, 256, 4), 0.648 /
# 0.689 with (8, 256, 4); call_s81's forced-tile table: (16, 256, 4) is the step's fastest.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_run default1 240 ""
latency_run step1 90 PAGEDRT_STEP_TIMING=1
latency_run lead1 75 PAGEDRT_TIMING_LEAD=1
latency_run default2 75 ""
latency_run step2 90 PAGEDRT_STEP_TIMING=1
rm -f "$out"/r/*.png
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
