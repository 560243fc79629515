#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit and .whl; ~4 min): the decode step's device timeline
# (decode_timeline.py: exposed time and idle gaps per kernel) at batch 1 with and without
# the one-row fused configs (gemv_triton.FUSED_ONE_ROW), at batch 8, and batch-1 latency.
set -u
. benchmarks/diagnostics/call_common.sh
for v in "b1:1:" "b1old:1:--no-one-row-configs" "b8:8:"; do
  IFS=: read -r name b flag <<< "$v"
  timeout 120 python3 benchmarks/diagnostics/decode_timeline.py --batch "$b" --context 512 \
    --steps 32 --out "$out/r/tl_$name.json" $flag > "$out/r/tl_$name.txt" 2>&1
  echo "== tl_$name status $?"; head -22 "$out/r/tl_$name.txt"; tail -1 "$out/r/tl_$name.txt"
done
timeout 150 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat --out "$out/r" > "$out/r/lat.txt" 2>&1
echo "lat status $?"; grep -E "ms|ctx" "$out/r/lat.txt" | tail -3
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
