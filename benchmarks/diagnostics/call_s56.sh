#!/usr/bin/env bash
# 2026-12-04 04:35 UTC (carry .commit and .whl; ~5 min). Issue 16, the decode matmul with
# split-K down projections and the SwiGLU activation in gate/up's epilogue (SILU_CONFIGS):
# Qwen2-0.5B 512/128 at batches 256, 8, 32, 64, 128 with the default and PAGEDRT_MATMUL=0,
# the decode graphs on and off (matmul_graphs.py), the GPU tests.
set -u
. benchmarks/diagnostics/call_common.sh
thr() {  # name, MATMUL
  PAGEDRT_MATMUL=$2 timeout 110 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 --name "$1" --out "$out/r" \
    > "$out/r/$1.txt" 2>&1
  echo "$1 status $?"
}
thr on_thr 1
thr off_thr 0
python3 - "$out/r" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_thr.json"))):
    rs = [r for r in json.load(open(f))["results"] if r.get("system") == "pagedrt"]
    print(os.path.basename(f), " ".join(f"{r['num_requests']}:{r['output_tok_s']:,.0f}:{100 * r.get('roofline_efficiency', 0):.1f}%" for r in rs))
PY
timeout 200 python3 benchmarks/diagnostics/matmul_graphs.py --batch-sizes 8,16,32,64,96,128 \
  > "$out/r/graphs.txt" 2>&1
echo "graphs status $?"; grep -v "^  (" "$out/r/graphs.txt" | tail -8
gpu_tests matmul 120 tests/gpu/test_matmul_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
