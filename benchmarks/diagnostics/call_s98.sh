#!/usr/bin/env bash
# (A record of its run: PAGEDRT_RACE_COUNTER_NOISE was removed in a19f620, so a rerun times
# the same sampling path for both of its values.)
# Third call of the 2026-12-05 19:20 lease (carry .commit, .whl and .tcache; ~9 min, on the
# machine warmed by call_s94/s96): where a 256- and a 64-row decode step's device time goes
# (decode_timeline.py at ctx 512, never measured at these batches: the s81 runs timed out or
# held prefills), then PAGEDRT_RACE_COUNTER_NOISE off / on / on / off (ABBA, one process each)
# on Qwen2-0.5B 256 x 512/128 at temperature 0.6 unseeded (`--sampling nanovllm`). Summaries
# last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
timeline_run 256 16 170
timeline_run 64 16 120
i=0
for v in 0 1 1 0; do
  i=$((i + 1))
  name="nanovllm_${i}_$v"
  PAGEDRT_RACE_COUNTER_NOISE=$v timeout 75 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --name "$name" --out "$out/r" --sampling nanovllm \
    --num-requests 256 --input-len 512 --output-len 128 > "$out/r/$name.txt" 2>&1
  echo "$name (PAGEDRT_RACE_COUNTER_NOISE=$v) status $?: $(grep -E "^pagedrt +qwen" \
    "$out/r/$name.txt" | head -1 | tr -s ' ' | cut -d' ' -f3-6)"
done
for b in 256 64; do echo "== tl_b$b"; sed -n '/exposed/,$p' "$out/r/tl_b$b.txt" | head -30 | cut -c1-150; done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
