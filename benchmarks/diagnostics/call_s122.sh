#!/usr/bin/env bash
# Issue 16's Qwen2-0.5B status rows at the session's last tree (call_s112.sh's runs without the
# cache warming, whose Triton cache the carried .tcache mostly holds), after the fused
# small-batch GPU tests (the fused ops' choice now takes any that times faster than its
# chain). One GPU; carry .commit, .whl and .tcache; ~8 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests fused 100 tests/gpu/test_fused_small_batch_gpu.py
status_bench main 170 --repeats 2
clocks_start sweep
sweep head
clocks_stop sweep
latency_run head 150
[ $SECONDS -lt 480 ] && status_bench nano 110 --workload nanovllm --repeats 2
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
