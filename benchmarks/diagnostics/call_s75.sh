#!/usr/bin/env bash
# For the next lease (carry .commit, .whl and .base = `git archive 5e59755 pagedrt`, the tree
# before NARROW_CONFIGS; ~7 min). Issue 16, batch 1: the skinny matmul's one- and two-row
# tiles (gemv_triton.NARROW_CONFIGS, timed at start-up for the O and down projections)
# against the tree without them, in the order new, base, base, new: the batch-1 step's
# timeline by kernel (each line also gives two unprofiled wall times per step and the
# timing's choices), then batch-1 latency at ctx 512 / 4,096 with HEAD.
set -u
. benchmarks/diagnostics/call_common.sh
for v in "new1:" "base1:.base" "base2:.base" "new2:"; do
  IFS=: read -r name tree <<< "$v"
  PYTHONPATH="/tmp/site:$PWD/$tree" timeout 100 python3 benchmarks/diagnostics/decode_timeline.py \
    --batch 1 --context 512 --steps 48 --out "$out/r/tl_$name.json" \
    > "$out/r/tl_$name.txt" 2>&1
  echo "== tl_$name status $?"; grep -E "^wall|^batch|^total|_gemv_kernel" "$out/r/tl_$name.txt" | head -7
done
timeout 150 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat --out "$out/r" > "$out/r/lat.txt" 2>&1
echo "lat status $?"; grep -E "batch1" "$out/r/lat.txt"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
