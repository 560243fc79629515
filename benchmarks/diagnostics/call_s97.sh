#!/usr/bin/env bash
# (A record of its run: PAGEDRT_RACE_COUNTER_NOISE was removed in a19f620, so a rerun times
# the same sampling path for both of its values.)
# PAGEDRT_RACE_COUNTER_NOISE (the race's Exp(1) noise drawn in registers; docs/design.md,
# "Seeded sampling") against the noise tensor, for the lease after call_s94/s96 (carry
# .commit, .whl and .tcache; ~9 min): its GPU tests, then Qwen2-0.5B 256 x 512/128 at
# temperature 0.6 unseeded (`--sampling nanovllm`) and seeded (`--sampling seeded`), each
# off / on / on / off (ABBA, one process each), then nano-vllm's workload off / on. A row's
# decode-step device time is in its JSON (the step split). Tables last; everything in
# $OUT/results.tgz. Caps of 150 s and unbuffered output: call_s98's 75 s runs of the same
# command all ran past their caps with nothing written (2026-12-05 19:38-19:42 UTC).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests counter_gpu 150 tests/gpu/test_sample_triton_gpu.py
run() {  # name, value of the switch, bench throughput arguments...
  local name=$1 v=$2
  shift 2
  PAGEDRT_RACE_COUNTER_NOISE=$v timeout 150 python3 -u -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --name "$name" --out "$out/r" "$@" > "$out/r/$name.txt" 2>&1
  echo "$name (PAGEDRT_RACE_COUNTER_NOISE=$v) status $?: $(grep -E "^pagedrt +qwen" \
    "$out/r/$name.txt" | head -1 | tr -s ' ' | cut -d' ' -f3-6)"
}
for s in nanovllm seeded; do
  i=0
  for v in 0 1 1 0; do
    i=$((i + 1))
    run "${s}_${i}_$v" "$v" --sampling "$s" --num-requests 256 --input-len 512 --output-len 128
  done
done
run nano_off 0 --workload nanovllm --skip-step-split
run nano_on 1 --workload nanovllm --skip-step-split
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
