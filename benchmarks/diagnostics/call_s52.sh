#!/usr/bin/env bash
# 2026-12-04 00:20 UTC (carry .commit and .whl; ~4 min). The decode matmul limited to 8-64
# rows: PAGEDRT_MATMUL=0 against the default, nano-vllm workload (off, on) and Qwen2-0.5B
# 512/128 at batches 256, 8, 32, 64 (on, off), then its GPU tests.
set -u
. benchmarks/diagnostics/call_common.sh
for n in nano_off:0:nanovllm nano_on:1:nanovllm thr_on:1:fixed thr_off:0:fixed; do
  IFS=: read -r name mm wl <<< "$n"
  extra=""; [ "$wl" = fixed ] && extra="--batch-sizes 8,32,64"
  # shellcheck disable=SC2086
  PAGEDRT_MATMUL=$mm timeout 75 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --workload "$wl" --skip-step-split $extra --name "$name" \
    --out "$out/r" > "$out/r/$name.txt" 2>&1
  echo "$name $?"
done
python3 benchmarks/trace_summary.py "$out"/r/*.json | cut -c1-150
for f in "$out"/r/*.json; do
  python3 -c "import json, sys; rs = [r for r in json.load(open(sys.argv[1]))['results']
if r.get('system') == 'pagedrt']; print(sys.argv[1].split('/')[-1], ' '.join(
f\"{r['num_requests']}:{r['output_tok_s']:,.0f}:{100 * r.get('roofline_efficiency', 0):.1f}%\"
for r in rs))" "$f"
done
gpu_tests matmul 100 tests/gpu/test_matmul_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
