#!/usr/bin/env bash
# Issue 16, after call_s84/s85 (carry .commit, .whl and .tcache; ~8 min): where the decode
# step's device time goes at batches 256 and 64 (the timelines call_s81 lost: one timed out
# compiling, the other's window held prefill steps, fixed in 2e1e8dd), with the Triton cache
# carried so that compiling no longer takes the cap; then batch 8 again beside them.
set -u
. benchmarks/diagnostics/call_common.sh
for b in 256 64 8; do
  timeline_run $b 24 150
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
