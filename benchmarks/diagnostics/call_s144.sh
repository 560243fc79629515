#!/usr/bin/env bash
# One call that fits whichever GPU comes (carry .commit, .whl and .tcache; under 10 min).
# On an H200: issue 16's Qwen2-0.5B status rows, as call_s112.sh (256 x 512/128 with
# --repeats 2, the batch sweep of record, batch-1 latency at ctx 512 / 4,096, nano-vllm's
# workload). On another GPU (an H100): batch-1 latency first (against the H100 figures of
# 2026-12-05 / 06), then every GPU test at HEAD in 4 shards capped at 300 s. Then the Triton
# cache back ($OUT/tc.txz.NN) and everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  warm_qwen2_cache 120
  status_bench main 170 --repeats 2
  latency_run head 120
  clocks_start sweep
  sweep head
  clocks_stop sweep
  status_bench nano 120 --workload nanovllm --repeats 2
else
  latency_run head 150
  gpu_tests_sharded gpu 300 4 tests/gpu
fi
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
