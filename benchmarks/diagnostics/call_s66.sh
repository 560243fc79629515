#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit, .whl and .base = `git archive af858ae pagedrt`; ~5 min):
# the 1-4-row kernels' weight loads before the PDL wait (PRE_K), with and without the one-row
# fused configs, against the session's start (.base), two processes each; then batch-1
# latency at ctx 512 / 4096 and the small-batch GPU tests.
set -u
. benchmarks/diagnostics/call_common.sh
for v in "new1::" "base1:.base:" "old1::--no-one-row-configs" "new2::" "base2:.base:" \
         "old2::--no-one-row-configs"; do
  IFS=: read -r name tree flag <<< "$v"
  PYTHONPATH="/tmp/site:$PWD/$tree" timeout 100 python3 benchmarks/diagnostics/decode_timeline.py \
    --batch 1 --context 512 --steps 48 --out "$out/r/tl_$name.json" $flag \
    > "$out/r/tl_$name.txt" 2>&1
  echo "== tl_$name status $?"; grep -E "^wall|^batch|^total" "$out/r/tl_$name.txt" | head -3
done
timeout 150 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat --out "$out/r" > "$out/r/lat.txt" 2>&1
echo "lat status $?"; grep -E "ms|ctx" "$out/r/lat.txt" | tail -3
gpu_tests gpu_small 150 tests/gpu/test_fused_small_batch_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
