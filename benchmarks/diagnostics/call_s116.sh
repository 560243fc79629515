#!/usr/bin/env bash
# The decode attention's first tile read before the PDL wait (EARLY_KV, issue 16) on one GPU
# (carry .commit, .whl, .tcache and .base = `git archive f7a85b6 pagedrt`, the tree before;
# ~8 min): the GPU tests that check it (the newest token written late, decode, FP8), then
# batch-1 latency in ABBA order and 64 x 512/128 with batches 8 and 32, each against .base.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
t0=$SECONDS
timeout 110 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
  tests/gpu/test_pdl_early_reads_gpu.py tests/gpu/test_decode_gpu.py \
  tests/gpu/test_fp8_kv_gpu.py > "$out/r/tests.txt" 2>&1
echo "GPU tests status $? in $((SECONDS - t0))s: $(tail -1 "$out/r/tests.txt")"
grep -E "FAILED|Error" "$out/r/tests.txt" | head -5
lat() {  # name, tree ("" = this one, .base = the tree before)
  local t0=$SECONDS
  PYTHONPATH="/tmp/site:$PWD/$2" timeout 60 python3 -m pagedrt.entrypoints.cli bench latency \
    --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 --name "lat_$1" \
    --out "$out/r" > "$out/r/lat_$1.txt" 2>&1
  echo "lat_$1 status $? in $((SECONDS - t0))s: $(grep -E "batch1" "$out/r/lat_$1.txt" \
    | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
}
lat head1 ""
lat base1 .base
lat base2 .base
lat head2 ""
sw() {  # name, tree
  local t0=$SECONDS
  PYTHONPATH="/tmp/site:$PWD/$2" timeout 85 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --num-requests 64 --max-num-seqs 64 --batch-sizes 8,32 --repeats 2 \
    --skip-step-split --name "sw_$1" --out "$out/r" > "$out/r/sw_$1.txt" 2>&1
  echo "sw_$1 status $? in $((SECONDS - t0))s: $(grep -E "^pagedrt +qwen" "$out/r/sw_$1.txt" \
    | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
sw head ""
sw base .base
