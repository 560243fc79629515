#!/usr/bin/env bash
# After call_s112.sh on the same lease (carry .commit, .whl and .tcache; ~6 min): issue 16's
# Llama-3-8B rows (`bench latency --preset llama3-8b --contexts 512,4096 --graphs on --repeats
# 3`, then `bench throughput --preset llama3-8b --skip-step-split`: the first process times the
# Llama-3-8B configs into the config cache, the second reads them) and issue 17's decode
# ratios (`bench attention --kv-cache-dtype fp8` at the four shapes of record: FP8 against the
# bf16 cache in one process). Then the Triton cache back ($OUT/tc.txz.NN). Everything in
# $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
t0=$SECONDS
timeout 200 python3 -m pagedrt.entrypoints.cli bench latency --preset llama3-8b \
  --contexts 512,4096 --graphs on --repeats 3 --name lat_llama --out "$out/r" \
  > "$out/r/lat_llama.txt" 2>&1
echo "lat_llama status $? in $((SECONDS - t0))s"; grep -E "^pagedrt +llama|start-up" \
  "$out/r/lat_llama.txt" | tr -s ' '
t0=$SECONDS
timeout 150 python3 -m pagedrt.entrypoints.cli bench throughput --preset llama3-8b \
  --skip-step-split --name llama --out "$out/r" > "$out/r/llama.txt" 2>&1
echo "llama status $? in $((SECONDS - t0))s"; grep -E "^pagedrt +llama|start-up" \
  "$out/r/llama.txt" | tr -s ' '
t0=$SECONDS
timeout 150 python3 -m pagedrt.entrypoints.cli bench attention --kv-cache-dtype fp8 \
  --decode-shapes llama3-8b:64:4096,llama3-8b:8:32768,qwen2-0.5b:64:4096,qwen2-0.5b:16:16384 \
  --out "$out/r/fp8" > "$out/r/fp8.txt" 2>&1
echo "fp8 attention status $? in $((SECONDS - t0))s"; tail -12 "$out/r/fp8.txt"
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
