#!/usr/bin/env bash
# 2026-12-02 16:10 UTC (carry .commit and .whl): the FP8 decode launch at 5 stages checked on
# the GPU (tests/gpu/test_fp8_kv_gpu.py), then issue 16's figures again
# (benchmarks/h200_record.sh: Qwen2-0.5B with HF peers and the batch sweep, 3 repeats, batch-1
# latency, nano-vllm's workload, the Llama-3-8B shape), with the narrow decode-row tile.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_fp8 150 tests/gpu/test_fp8_kv_gpu.py
mkdir -p "$out/r/record"
OUT="$out/r/record" timeout 420 bash benchmarks/h200_record.sh > "$out/r/record.txt" 2>&1
echo "== record (status $?)"; grep -v -i "warn" "$out/r/record.txt" | tail -45 | cut -c1-200
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
