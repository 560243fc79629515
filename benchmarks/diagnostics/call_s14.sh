#!/usr/bin/env bash
# Prepared on 2026-12-02 for the next session's first device call (carry .commit .whl; no
# GGUF needed). Not yet run. PART=1 (~6 min): the tests and the nano-vllm workload; PART=2
# (~6 min): the rest.
# The GPU tests under the defaults set at becd419 (FP8 V dim-major, PDL on for launches of
# <= 256 rows), four pytest processes at once; then issue 16's figures with PDL on by
# default, each the median of 3 runs in one engine: the nano-vllm workload (target 80k), the
# Qwen2-0.5B workload greedy and with top-k/top-p/min-p (`--sampling filters`), and the
# 1/8/32/64 sweep, each row warmed up at its size. Last, issue 17's FP8 decode kernel over
# decode_tune.py's full grid (split counts included: the FP8 kernel is not memory-bound, so
# more programs per SM may hide more latency) and issue 16's Qwen2 attention target (B64
# L2048, >= 3.0 TB/s) over the same grid.
set -u
. benchmarks/diagnostics/call_common.sh
case "${PART:-1}" in
1)
# is a kernel profiler there? (the FP8 decode kernel is not memory-bound; what bounds it is
# guesswork from the PTX without one)
echo "profilers: $(command -v ncu nsys 2>/dev/null | tr '\n' ' ')"
(gpu_tests gpu_a 240 tests/gpu/test_fp8_kv_gpu.py tests/gpu/test_smoke_gpu.py \
   > "$out/r/sum_a.txt") &
(gpu_tests gpu_b 240 tests/gpu/test_beam_search_gpu.py tests/gpu/test_window_gpu.py \
   tests/gpu/test_sample_triton_gpu.py > "$out/r/sum_b.txt") &
(gpu_tests gpu_c 240 tests/gpu/test_spec_decode_gpu.py tests/gpu/test_pdl_gpu.py \
   tests/gpu/test_fused_small_batch_gpu.py > "$out/r/sum_c.txt") &
(gpu_tests gpu_d 240 tests/gpu/test_tp_gpu.py > "$out/r/sum_d.txt") &
wait
timeout 120 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
  --workload nanovllm --repeats 3 --skip-step-split --name nanovllm --out "$out/r" \
  > "$out/r/nanovllm.txt" 2>&1
cat "$out"/r/sum_*.txt
echo "== nano-vllm workload"; grep -h "^pagedrt " "$out/r/nanovllm.txt" | head -3
;;
2)
for s in greedy filters; do
  timeout 90 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
    --sampling "$s" --repeats 3 --skip-step-split --name "thr_$s" --out "$out/r" \
    $([ "$s" = greedy ] && echo "--batch-sizes 1,8,32,64") > "$out/r/thr_$s.txt" 2>&1
done
timeout 150 python3 benchmarks/decode_tune.py --out "$out/r/tune_full" --kv-cache-dtype both \
  --cases llama3-8b:64:4096,qwen2-0.5b:64:2048 > "$out/r/tune_full.txt" 2>&1
echo "== qwen2-0.5b, greedy (with the batch sweep) and filters"
grep -h "^pagedrt " "$out"/r/thr_*.txt | head -12
if command -v ncu > /dev/null; then  # the FP8 and bf16 decode kernels' counters
  for dt in fp8 auto; do
    timeout 90 ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section Occupancy \
      python3 benchmarks/diagnostics/decode_once.py --kv-cache-dtype $dt > "$out/r/ncu_$dt.txt" 2>&1
  done
fi
echo "== decode kernel, full grid"; grep -h "default" "$out/r/tune_full.txt" | cut -c1-160
;;
esac
[ -f "$out/r/ncu_fp8.txt" ] && { echo "== ncu, fp8"; grep -E "Throughput|Stall|Issue|Occupancy|Eligible" "$out/r/ncu_fp8.txt" | head -30; }
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
