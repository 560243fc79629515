#!/usr/bin/env bash
# Prepared 2026-12-02 16:30 UTC for the next session (this one's device time ran out), first
# call (carry .commit and .whl; ~7 min):
# (1, ~1.5 min) the FP8 decode kernel's stall reasons (issue 17: at 2.7 TB/s, neither the
#   conversions, the MMAs, the access pattern nor, now, the pipeline depth bounds it;
#   benchmarks/results/RUNS.md, 15:20 runs): Nsight Compute's per-reason warp stalls
#   (smsp__average_warps_issue_stalled_*_per_issue_active) for FP8 (the 5-stage default) and
#   bf16, Llama-3-8B heads B64 L4096;
# (2, ~5 min) Llama-3-8B 256 x 4,096 / 256 FP8 against bf16 with the narrow decode-row tile
#   and the 5-stage FP8 decode launch (0.95x at 721cf4e).
set -u
. benchmarks/diagnostics/call_common.sh
if command -v ncu > /dev/null; then
  for dt in fp8 auto; do
    timeout 80 ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
      --section LaunchStats --metrics \
      'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      python3 benchmarks/diagnostics/decode_once.py --kv-cache-dtype $dt > "$out/r/ncu_$dt.txt" 2>&1
    echo "== ncu, $dt (status $?)"
    grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy" "$out/r/ncu_$dt.txt"
    grep -E "issue_stalled" "$out/r/ncu_$dt.txt" | sort -k3 -g -r | head -6
  done
else
  echo "no ncu on this machine"
fi
fp8_vs_bf16 fp8kv_256 256 4096 256 4368
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
