#!/usr/bin/env bash
# Issue 16 (carry .commit and .whl; ~9 min): with PAGEDRT_FUSED_ROPE on by default, the device
# time by kernel of batch-1 and batch-8 decoding (Qwen2-0.5B, 512 in / 128 out), batch-1
# latency with the RoPE epilogue and without (on, off; three repeats each), and the Llama-3-8B
# shape with the 8-128-row decode matmul: 256 x 512/128 and batch-1 latency at ctx 512 and
# 4,096, then the same throughput with PAGEDRT_MATMUL=0 (cuBLAS) in the same call.
set -u
. benchmarks/diagnostics/call_common.sh
for b in 1 8; do
  timeout 120 python3 benchmarks/diagnostics/workload_kernels.py --num-requests $b \
    --input-len 512 --output-len 128 --repeats 2 --out "$out/r/kernels_b$b.json" 2>&1 | tail -1
done
for n in rope:1 plain:0; do
  IFS=: read -r name rope <<< "$n"
  PAGEDRT_FUSED_ROPE=$rope timeout 100 python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 --name "lat_$name" \
    --out "$out/r" > "$out/r/lat_$name.txt" 2>&1
  echo "lat_$name status $?"; grep -E "^pagedrt" "$out/r/lat_$name.txt" | tail -2
done
timeout 150 python3 -m pagedrt.entrypoints.cli bench latency --preset llama3-8b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat_llama3 --out "$out/r" \
  > "$out/r/lat_llama3.txt" 2>&1
echo "lat_llama3 status $?"; grep -E "^pagedrt" "$out/r/lat_llama3.txt" | tail -2
for n in thr_llama3:1 thr_llama3_cublas:0; do
  IFS=: read -r name mm <<< "$n"
  PAGEDRT_MATMUL=$mm timeout 150 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset llama3-8b --skip-step-split --name "$name" --out "$out/r" > "$out/r/$name.txt" 2>&1
  echo "$name status $?"; grep -E "^pagedrt +llama" "$out/r/$name.txt" | head -3
done
python3 - "$out/r" <<'PY'
import json, sys, os
for b in (1, 8):
    f = os.path.join(sys.argv[1], f"kernels_b{b}.json")
    if not os.path.exists(f):
        continue
    k = json.load(open(f))["kernels_us"]
    tot = sum(v[1] for v in k.values())
    print(f"batch {b}: device {tot / 1e3:.1f} ms; top kernels (count, us total):")
    for name, v in sorted(k.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {v[0]:>6} {v[1]:>10.0f}  {name[:90]}")
PY
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
