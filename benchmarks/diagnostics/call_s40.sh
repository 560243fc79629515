#!/usr/bin/env bash
# Prepared 2026-12-03 07:00 UTC for the next lease (carry .commit and .whl; ~6 min). Issue 17's
# open kernel target: FP8 decode at Qwen2-0.5B heads (14/2 x 64) is 0.66-0.70x of bf16's
# time (target 0.6), Llama-3-8B heads 0.59x. At head_dim 64 an FP8 token row of one KV head
# is 64 bytes, half a 128-byte line (bf16 at 64, FP8 at 128: whole lines), the other half
# read by the other KV head's programs at another time. Test that: K head-major (one head's
# tokens of a block contiguous), and where the warp kernel stalls (Nsight Compute) at both
# shapes; the default's timing three times in one process to size the run-to-run spread
# (call_s35 timed one setting at 29.5 and 36.6 us in two processes).
set -u
. benchmarks/diagnostics/call_common.sh
if command -v ncu > /dev/null; then
  for case in qwen2-0.5b:64:4096 llama3-8b:64:4096; do
    timeout 80 ncu --clock-control none --kernel-name regex:_decode_warp_kernel --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
      --section LaunchStats --section MemoryWorkloadAnalysis --metrics \
      'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      python3 benchmarks/diagnostics/decode_once.py --kv-cache-dtype fp8 --case $case \
      > "$out/r/ncu_${case%%:*}.txt" 2>&1
    echo "== ncu, $case (status $?)"
    grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|L2 Hit|Mem Busy" \
      "$out/r/ncu_${case%%:*}.txt"
    grep -E "issue_stalled" "$out/r/ncu_${case%%:*}.txt" | sort -k3 -g -r | head -5
  done
fi
for i in 1 2; do
  tune hm$i --kv-cache-dtype both --default-only \
    --cases qwen2-0.5b:64:4096,qwen2-0.5b:64:2048,llama3-8b:64:4096 --k-head-major
  tune tm$i --kv-cache-dtype both --default-only \
    --cases qwen2-0.5b:64:4096,qwen2-0.5b:64:2048,llama3-8b:64:4096
done
# small batches: FP8 at B1 L4096 took 16.0 us against bf16's 11.8 (call_s36): 16 splits of a
# one-warp program leave most SMs idle; more, shorter partitions, and 2 warps
tune b1 --kv-cache-dtype fp8 --cases llama3-8b:1:4096,qwen2-0.5b:1:4096,llama3-8b:4:4096 \
  --block-n 32,64 --warps 1,2 --stages 5 --splits 16,32,64 --warp-tiles 1
echo "== tune b1"; grep -E "^(llama|qwen)" "$out/r/tune_b1.txt" | cut -c1-330
for n in hm1 tm1 hm2 tm2; do
  echo "== $n"; grep -E "^(llama|qwen)" "$out/r/tune_$n.txt" | cut -c1-80
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
