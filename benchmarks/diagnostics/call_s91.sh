#!/usr/bin/env bash
# Issue 16, host work of a decode step (carry .commit, .whl, .tcache; ~8 min): decode inputs
# staged for the CUDA graphs (pagedrt/ops/graph_inputs.py; one copy and the replay, against
# the copy, the pending-id gather and five copies plus fills into the static buffers with
# PAGEDRT_STAGED_GRAPH_INPUTS=0). The GPU tests of the staged inputs and the tiny engine, then
# batch-1 steps with their host phases (batch1_steps.py, fresh processes, off/on/on/off), then
# the batch-1 latency of record off and on. SHORT=1 (~4 min): the staged GPU tests, one
# batch-1 process off and one on, no latency runs.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
if [ "${SHORT:-0}" = 1 ]; then
  gpu_tests staged 110 tests/gpu/test_graph_inputs_gpu.py
  order="0 1"
else
  gpu_tests staged 150 tests/gpu/test_graph_inputs_gpu.py tests/gpu/test_smoke_gpu.py \
    tests/gpu/test_philox_gpu.py
  order="0 1 1 0"
fi
i=0
for v in $order; do
  i=$((i + 1))
  PAGEDRT_STAGED_GRAPH_INPUTS=$v timeout 60 python3 benchmarks/diagnostics/batch1_steps.py \
    --runs 2 > "$out/r/b1_$i.staged$v.txt" 2>&1
  echo "$i: staged=$v status $?"; grep -E "^(run|  )" "$out/r/b1_$i.staged$v.txt" | tail -2 | cut -c1-170
done
[ "${SHORT:-0}" = 1 ] || switch_runs latency PAGEDRT_STAGED_GRAPH_INPUTS off:0 on:1
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
