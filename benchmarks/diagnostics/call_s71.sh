#!/usr/bin/env bash
# For the next lease, after call_s70.sh (carry .commit and .whl; ~7 min). Issue 16, batch 1:
# how many weight values per thread the 1-4-row kernels load before the PDL wait
# (PAGEDRT_GEMV_PRE_VALUES: 0 none, 64 the default, 128, 256), batch-1 latency, one process
# each in the order 64, 128, 256, 0, 256, 128, 64.
set -u
. benchmarks/diagnostics/call_common.sh
switch_runs latency PAGEDRT_GEMV_PRE_VALUES a64:64 a128:128 a256:256 none:0 b256:256 \
  b128:128 b64:64
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
