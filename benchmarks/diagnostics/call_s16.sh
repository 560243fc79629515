#!/usr/bin/env bash
# Session of 2026-12-02 (08:30 UTC), second device call (carry .commit .whl). Call 1
# (call_s15.sh) profiled the FP8 decode kernel with Nsight Compute: 255 registers per thread
# (bf16: 125), so 2 programs per SM (bf16: 4) and 12% occupancy, 2.37 TB/s. Here: decode_tune
# over launch settings with a register cap (maxnreg) for the FP8 kernel on both head shapes
# (issue 17), the bf16 kernel on Qwen2-0.5B heads at B64 L2048 (issue 16's 3.0 TB/s target),
# the bf16 Llama-3-8B default as the FP8 peer; compiled first in 8 parallel shards (timings
# discarded), then timed in one process from Triton's cache. Then issue 16's Qwen2 throughput:
# greedy with the 1/8/32/64 sweep, and with top-k/top-p/min-p, medians of 3.
set -u
. benchmarks/diagnostics/call_common.sh
FP8="--kv-cache-dtype fp8 --block-n 64,128 --warps 4,8 --stages 2,3 --splits 1,2 --maxnreg 0,128,168"
tune fp8 --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 $FP8
tune bf16 --kv-cache-dtype auto --cases qwen2-0.5b:64:2048 \
  --block-n 32,64,128 --warps 2,4,8 --stages 2,3,4 --splits 1,2,4,8
timeout 100 python3 benchmarks/decode_tune.py --out "$out/r/tune_bf16_llama" --cases \
  llama3-8b:64:4096 --block-n 64 --warps 4 --stages 3 --splits 1 > "$out/r/tune_bf16_llama.txt" 2>&1
for s in greedy filters; do
  timeout 100 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
    --sampling "$s" --repeats 3 --skip-step-split --name "thr_$s" --out "$out/r" \
    $([ "$s" = greedy ] && echo "--batch-sizes 1,8,32,64") > "$out/r/thr_$s.txt" 2>&1
done
echo "== qwen2-0.5b, greedy (with the batch sweep) and filters"
grep -h "^pagedrt " "$out"/r/thr_*.txt | head -12
echo "== decode kernel"; grep -h "default" "$out"/r/tune_*.txt | cut -c1-250
rm -rf "$out"/r/shard_*
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
