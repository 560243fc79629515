#!/usr/bin/env bash
# The batch sweep's slow first runs on the GPU (carry .commit, .whl, .tcache; ~5 min):
# benchmarks/diagnostics/first_run.py at Qwen2-0.5B's 512/128, batches 32, 64 and 128, three
# runs each, with the repeats' seeds of before 141280b (--old-seeds: they hit the prefix cache,
# found on the CPU) and with fresh_seed's. Expected: prefix-cache hits and fast repeats only
# with --old-seeds; any first-run penalty left without them shows with its compiles, cudaMalloc
# calls and GC time. One line per run; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
for mode in old new; do
  flag=""; [ "$mode" = old ] && flag="--old-seeds"
  timeout 200 python3 -u benchmarks/diagnostics/first_run.py --preset qwen2-0.5b \
    --batch-sizes 32,64,128 --runs 3 $flag --out "$out/r/first_run_$mode" \
    > "$out/r/first_run_$mode.txt" 2>&1
  echo "== first_run $mode (status $?)"; grep -E "^batch|run [0-9]" "$out/r/first_run_$mode.txt" \
    | cut -c1-190
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
