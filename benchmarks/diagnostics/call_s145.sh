#!/usr/bin/env bash
# One call for whichever GPU comes (carry .commit, .whl and .tcache; under 10 min): the read
# floor of the decode projections' weights against the skinny matmul and cuBLAS
# (benchmarks/diagnostics/read_floor.py, both presets' shapes); on an H200 first issue 16's
# Qwen2-0.5B status rows (call_s144.sh's H200 branch), elsewhere first the rest of the GPU
# tests call_s144 cut (tests/gpu/test_decode_gpu.py). Then the Triton cache back
# ($OUT/tc.txz.NN) and everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  status_bench main 170 --repeats 2
  latency_run head 120
  status_bench nano 120 --workload nanovllm --repeats 2
else
  gpu_tests decode 200 tests/gpu/test_decode_gpu.py
fi
t0=$SECONDS
timeout 240 python3 benchmarks/diagnostics/read_floor.py --out "$out/r/read_floor" \
  > "$out/r/read_floor.txt" 2>&1
echo "read_floor status $? in $((SECONDS - t0))s"; cat "$out/r/read_floor.txt" | tail -12
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
