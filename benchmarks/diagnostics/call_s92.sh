#!/usr/bin/env bash
# Issue 16, decode inputs staged for the CUDA graphs at batches 8-256 (carry .commit, .whl,
# .tcache; ~8 min): the batch sweep of record (Qwen2-0.5B 512/128 at 256 and batches 8-128,
# --repeats 3) with PAGEDRT_STAGED_GRAPH_INPUTS=0 and =1, one process each, off first; then
# nano-vllm's workload (temperature 0.6) on and off.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
sweep copies PAGEDRT_STAGED_GRAPH_INPUTS=0
sweep staged PAGEDRT_STAGED_GRAPH_INPUTS=1
for v in 1 0; do
  PAGEDRT_STAGED_GRAPH_INPUTS=$v timeout 80 python3 -m pagedrt.entrypoints.cli bench \
    throughput --preset qwen2-0.5b --workload nanovllm --skip-step-split --name "nv_$v" \
    --out "$out/r" > "$out/r/nv_$v.txt" 2>&1
  echo "nanovllm staged=$v status $?: $(grep -E "^pagedrt +qwen" "$out/r/nv_$v.txt" \
    | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
