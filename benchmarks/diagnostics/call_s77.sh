#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit, .whl and .base = `git archive 5db82a9 pagedrt`, the tree
# before this change; ~8 min): the start-up timing with an L2 flush before each timed call
# (config_timing.fastest_config, PAGEDRT_COLD_L2_TIMING) and the long-K tiles for the O and down
# projections (gemv_triton.WIDE_K_CONFIGS), against the tree without both: batch-1 latency at
# ctx 512 / 4,096 in the order new, base, new with warm timing, base, new; then the batch-1
# step's timeline by kernel with HEAD (the first run pays the compiles: longer cap).
set -u
. benchmarks/diagnostics/call_common.sh
lat() {  # name, tree, extra env
  env $3 PYTHONPATH="/tmp/site:$PWD/$2" timeout 150 python3 -m pagedrt.entrypoints.cli \
    bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 \
    --name "lat_$1" --out "$out/r" > "$out/r/lat_$1.txt" 2>&1
  echo "lat_$1 status $?: $(grep -E "batch1" "$out/r/lat_$1.txt" | tr -s ' ' | cut -d' ' -f4,6 \
    | tr '\n' ' ')"
}
lat new1 "" X=1
lat base1 .base X=1
lat warm1 "" PAGEDRT_COLD_L2_TIMING=0
lat base2 .base X=1
lat new2 "" X=1
timeout 120 python3 benchmarks/diagnostics/decode_timeline.py --batch 1 --context 512 \
  --steps 48 --out "$out/r/tl_new.json" > "$out/r/tl_new.txt" 2>&1
echo "tl_new status $?"; grep -E "^wall|^fused|^batch|^total|_gemv_kernel" "$out/r/tl_new.txt" | head -8
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
