#!/usr/bin/env bash
# Issue 16, batch 1, for the next lease (carry .commit and .whl, and .tcache when a call has
# saved one; ~9 min): is the start-up timing's PDL lead (PAGEDRT_TIMING_LEAD=1, opt-in since
# da771ce) a better chooser of the batch-1 tiles? Batch-1 latency at ctx 512 / 4,096 from
# fresh engines, default and lead alternating (the first run pays the compiles), each run's
# 1-row choices printed; then the Triton cache saved for the next call (save_triton_cache).
# call_s82 measured 0.608 / 0.651 ms with the lead and gate/up (16, 256, 4), 0.648 / 0.689
# with (8, 256, 4); call_s81 forced-tile table: (16, 256, 4) is the step's fastest.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
latency_run default1 250 ""
latency_run lead1 80 PAGEDRT_TIMING_LEAD=1
latency_run default2 80 ""
latency_run lead2 80 PAGEDRT_TIMING_LEAD=1
rm -f "$out"/r/*.png
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
