#!/usr/bin/env bash
# Device call of 2026-12-02 (carry .commit .whl), after call_s12.sh, whose throughput sweep
# with PAGEDRT_PDL=1 ran slower (one run each way: 256 x 512/128 70.7k -> 64.2k, prefill step
# 25.6 -> 28.4 ms; batch 1 987 -> 882) while `bench latency` ran faster (0.89 -> 0.79 ms).
# PDL is now kept to launches of at most PDL_MAX_ROWS = 256 rows (no prefill); this times
# `bench throughput --batch-sizes 1,8` (the 256 x 512/128 workload is run first) with PDL
# 0, 1, 1, 0, then `bench latency` with PDL on once more.
set -u
. benchmarks/diagnostics/call_common.sh
i=0
for pdl in 0 1 1 0; do
  i=$((i + 1))
  PAGEDRT_PDL=$pdl timeout 65 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --batch-sizes 1,8 --skip-step-split --name "thr_${i}_pdl$pdl" \
    --out "$out/r" > "$out/r/thr_${i}_pdl$pdl.txt" 2>&1
done
PAGEDRT_PDL=1 timeout 45 python3 -m pagedrt.entrypoints.cli bench latency --graphs on \
  --repeats 3 --preset qwen2-0.5b --name lat_pdl1 --out "$out/r" > "$out/r/lat.txt" 2>&1
for f in "$out"/r/thr_*_pdl*.txt; do
  echo "== $(basename "$f")"; grep -h "^pagedrt .*x512x128\|prefill steps\|decode steps" "$f"
done
echo "== latency, PDL on"; grep -h "^pagedrt " "$out/r/lat.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
