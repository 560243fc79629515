#!/usr/bin/env bash
# 2026-12-03 17:10 UTC (carry .commit and .whl; ~7 min). (1) Issue 17's one unmet decode
# shape: Nsight Compute (--set full) on the FP8 warp-tile kernel and its split-K reduce at
# Qwen2-0.5B heads B64 L4096 (28.0 us, 0.68x of bf16) against B16 L16384 (25.0 us, 0.59x),
# which read the same bytes with as many programs of the same partition length, and the bf16
# kernel at B64 L4096. (2) Issue 16: the warp tiles over bf16 at Qwen2-0.5B heads with the
# FP8 cache's split counts (explicit splits up to 64) at batch 1 to 256. (3) FP8 against bf16
# end to end at batch 1 (latency) and 8 (throughput) under the 64-token partitions.
# (4) `pagedrt bench attention`'s back-to-back timing, final form, on the GPU.
set -u
. benchmarks/diagnostics/call_common.sh
if command -v ncu > /dev/null; then
  for c in fp8:qwen2-0.5b:64:4096 fp8:qwen2-0.5b:16:16384 auto:qwen2-0.5b:64:4096; do
    dt=${c%%:*}; case=${c#*:}; n="ncu_${dt}_$(echo ${case#*:} | tr : _)"
    timeout 120 ncu --clock-control none --kernel-name 'regex:_decode_(warp_|reduce_)?kernel' \
      --launch-skip 4 --launch-count 2 --set full \
      python3 benchmarks/diagnostics/decode_once.py --kv-cache-dtype $dt --case $case \
      > "$out/r/$n.txt" 2>&1
    echo "== $n (status $?)"
    grep -E "^  _decode|Duration|DRAM Throughput|Elapsed Cycles|SM Active Cycles|Achieved Occ|Registers Per|Waves Per|Issue Slots Busy|L2 Hit Rate  " "$out/r/$n.txt" | cut -c1-100
  done
fi
tune wb --kv-cache-dtype auto --block-n 32,64 --warps 1,2 --stages 5 --splits 0,4,8,16,32,64 \
  --warp-tiles 1 --cases qwen2-0.5b:1:512,qwen2-0.5b:1:4096,qwen2-0.5b:8:4096,\
qwen2-0.5b:64:2048,qwen2-0.5b:64:4096,qwen2-0.5b:256:640,qwen2-0.5b:16:16384
echo "== tune wb"; grep -E "^(llama|qwen)" "$out/r/tune_wb.txt" | cut -c1-260
cli="python3 -m pagedrt.entrypoints.cli bench"
for dt in auto fp8; do
  for p in qwen2-0.5b llama3-8b; do
    timeout 150 $cli latency --preset $p --kv-cache-dtype $dt --contexts 512,4096 \
      --num-tokens 64 --graphs on --name lat_${p}_$dt --out "$out/r" > "$out/r/lat_${p}_$dt.txt" 2>&1
    echo "== latency $p $dt (status $?)"; tail -4 "$out/r/lat_${p}_$dt.txt"
  done
done
fp8_vs_bf16 b8_llama 8 4096 256 8192
OUT="$out/r/fp8kv" FP8KV_STEPS=attention bash benchmarks/fp8kv_h200.sh | tail -8
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
