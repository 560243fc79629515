#!/usr/bin/env bash
# The first call of the next lease (carry .commit, .whl and .tcache if there is one; ~7 min):
# Triton's cache warmed as in call_s110.sh, then the same 256 x 512/128 command twice in fresh
# processes with PAGEDRT_CONFIG_CACHE (call_common.sh): the first times its kernel configs and
# files them, the second should read them and time none. Their wall times give the start-up
# time the file saves (each prints its start-up line: graph capture, configs timed and read),
# their tok/s whether the second process runs as fast, and the file's
# line counts that the second added nothing. The GPU's clocks are sampled through each run
# (clocks_start). Then the batch sweep of record and batch-1 latency (both reading the file),
# and the Triton cache back with the file inside ($OUT/tc.txz.NN: put them in .tcache/).
# Summaries last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
warm_qwen2_cache 200
lines() { cat "$PAGEDRT_CONFIG_CACHE"/*.jsonl 2>/dev/null | wc -l; }
for run in 1 2; do
  t0=$SECONDS
  clocks_start "main$run"
  timeout 150 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
    --skip-step-split --repeats 2 --name "main$run" --out "$out/r" > "$out/r/main$run.txt" 2>&1
  status=$?
  echo "main$run status $status in $((SECONDS - t0))s, choices on disk: $(lines):" \
    "$(grep -h "output tok/s of each\|prefill steps" "$out/r/main$run.txt" | tr -s ' ' \
       | cut -c1-110 | tr '\n' ' ')"
  grep -h "start-up" "$out/r/main$run.txt"
  clocks_stop "main$run"
done
clocks_start sweep
sweep head
clocks_stop sweep
latency_run head 150
echo "choices on disk at the end: $(lines) lines in $(ls "$PAGEDRT_CONFIG_CACHE" | wc -l) files"
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
