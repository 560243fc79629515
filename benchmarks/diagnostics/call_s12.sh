#!/usr/bin/env bash
# Device call of 2026-12-02 (carry .commit .whl; no GGUF needed), after call_s11.sh:
# programmatic dependent launch against none at batch 1 (issue 16: `bench latency`, CUDA graphs,
# median of 3 runs, PDL 0, 1, 1, 0; then the 1/8/32/64 sweep each way); the FP8 cache end to end
# where bf16 is KV-bound and decode dominates (issue 17: Llama-3-8B shape, 128 x 2048 in / 1024
# out, 30% of the GPU's memory; V dim-major, the new default); the top-k/top-p filter's device
# time, selection against the full sort (filters_gpu.py).
set -u
. benchmarks/diagnostics/call_common.sh
i=0
for pdl in 0 1 1 0; do
  i=$((i + 1))
  PAGEDRT_PDL=$pdl timeout 60 python3 -m pagedrt.entrypoints.cli bench latency --graphs on \
    --repeats 3 --preset qwen2-0.5b --name "lat_${i}_pdl$pdl" --out "$out/r" \
    >> "$out/r/lat.txt" 2>&1
done
PAGEDRT_FP8_V_DIM_MAJOR=1 timeout 170 python3 -m pagedrt.entrypoints.cli bench throughput \
  --preset llama3-8b --kv-cache-dtype fp8 --compare-kv-cache-dtype auto --num-requests 128 \
  --input-len 2048 --output-len 1024 --max-model-len 4096 --max-num-seqs 256 \
  --gpu-memory-utilization 0.30 --skip-step-split --warm-up-requests 4 --name fp8kv_decode \
  --out "$out/r" > "$out/r/fp8kv_decode.txt" 2>&1
timeout 60 python3 benchmarks/diagnostics/filters_gpu.py --out "$out/r/filters.json" \
  > "$out/r/filters.txt" 2>&1
for pdl in 0 1; do
  PAGEDRT_PDL=$pdl timeout 100 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --batch-sizes 1,8,32,64 --skip-step-split --name "thr_pdl$pdl" \
    --out "$out/r" > "$out/r/thr_pdl$pdl.txt" 2>&1
done
echo "== latency, graphs, median of 3 (PDL 0, 1, 1, 0)"; grep -h "^pagedrt " "$out/r/lat.txt"
echo "== fp8 end to end"; grep -h "fp8_e4m3 / bfloat16\|KV cache" "$out/r/fp8kv_decode.txt"
echo "== filters"; tail -8 "$out/r/filters.txt"
echo "== throughput by batch (PDL 0 then 1)"; grep -h "^pagedrt " "$out"/r/thr_pdl*.txt | head -12
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
