#!/usr/bin/env bash
# For the next lease (carry .commit and .whl; ~9 min). Issue 16, two opt-in fusions first on a
# GPU: the RMSNorms in the O and down projections (PAGEDRT_MATMUL_NORM=1) and RoPE with the
# K/V write in the 1-4-row QKV kernel (PAGEDRT_FUSED_ROPE=1). Their GPU tests with the rest of
# the decode matmul's and the small-batch fusions', the decode graphs of cuBLAS, the default
# path and the norms in the projections (matmul_graphs.py --variants off,on,norm), batch-1
# latency with PAGEDRT_FUSED_ROPE=1 and without (on, off, off, on), then Qwen2-0.5B 512/128 at
# batches 8, 32, 64, 128 with PAGEDRT_MATMUL_NORM=1 and without (on, off, off, on).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests matmul 240 tests/gpu/test_matmul_gpu.py tests/gpu/test_fused_small_batch_gpu.py
for n in rope1:1 plain1:0 plain2:0 rope2:1; do
  IFS=: read -r name rope <<< "$n"
  PAGEDRT_FUSED_ROPE=$rope timeout 100 python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --name "lat_$name" --out "$out/r" \
    > "$out/r/lat_$name.txt" 2>&1
  echo "lat_$name status $?"; grep -E "^pagedrt" "$out/r/lat_$name.txt" | tail -2
done
timeout 240 python3 benchmarks/diagnostics/matmul_graphs.py --variants off,on,norm \
  --batch-sizes 8,16,32,64,96,128 > "$out/r/graphs.txt" 2>&1
echo "graphs status $?"; grep -v "^  (" "$out/r/graphs.txt" | tail -8
thr() {  # name, MATMUL_NORM
  PAGEDRT_MATMUL_NORM=$2 timeout 100 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 --name "$1" --out "$out/r" \
    > "$out/r/$1.txt" 2>&1
  echo "$1 status $?"
}
thr norm1 1; thr plain1 0; thr plain2 0; thr norm2 1
python3 - "$out/r" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*[12].json"))):
    rs = [r for r in json.load(open(f))["results"] if r.get("system") == "pagedrt"]
    print(os.path.basename(f), " ".join(f"{r['num_requests']}:{r['output_tok_s']:,.0f}:{100 * r.get('roofline_efficiency', 0):.1f}%" for r in rs))
PY
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
