#!/usr/bin/env bash
# Session of 2026-12-02 (08:30 UTC), first device call (carry .commit .whl). The PART=1 of
# call_s14.sh (prepared the session before, never run; removed since, this script and
# call_s16.sh having run what it held), reordered so the profiles come first, on a quiet GPU: Nsight Compute counters of the
# FP8 and bf16 decode kernels (issue 17: what bounds the FP8 kernel at 2.4 TB/s), the kernel
# table of a batch-1 decode graph replay (issue 16: where 0.79 ms goes against the 0.24 ms
# weight-read floor); then every GPU test under the defaults of becd419 (FP8 V dim-major,
# PDL on), four pytest processes at once; last the nano-vllm workload (median of 3).
set -u
. benchmarks/diagnostics/call_common.sh
echo "profilers: $(command -v ncu nsys 2>/dev/null | tr '\n' ' ')"
if command -v ncu > /dev/null; then
  for dt in fp8 auto; do
    timeout 75 ncu --clock-control none --kernel-name regex:_decode_kernel --launch-skip 2 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section Occupancy --section InstructionStats \
      --section ComputeWorkloadAnalysis --section LaunchStats \
      python3 benchmarks/diagnostics/decode_once.py --kv-cache-dtype $dt > "$out/r/ncu_$dt.txt" 2>&1
  done
fi
timeout 100 python3 benchmarks/profile_step.py --preset qwen2-0.5b --num-seqs 1 --input-len 512 \
  --out "$out/r/prof_b1" > "$out/r/prof_b1.txt" 2>&1
(gpu_tests gpu_a 200 tests/gpu/test_fp8_kv_gpu.py tests/gpu/test_smoke_gpu.py \
   > "$out/r/sum_a.txt") &
(gpu_tests gpu_b 200 tests/gpu/test_beam_search_gpu.py tests/gpu/test_window_gpu.py \
   tests/gpu/test_sample_triton_gpu.py > "$out/r/sum_b.txt") &
(gpu_tests gpu_c 200 tests/gpu/test_spec_decode_gpu.py tests/gpu/test_pdl_gpu.py \
   tests/gpu/test_fused_small_batch_gpu.py > "$out/r/sum_c.txt") &
(gpu_tests gpu_d 200 tests/gpu/test_tp_gpu.py > "$out/r/sum_d.txt") &
wait
timeout 100 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
  --workload nanovllm --repeats 3 --skip-step-split --name nanovllm --out "$out/r" \
  > "$out/r/nanovllm.txt" 2>&1
cat "$out"/r/sum_*.txt
echo "== batch-1 decode graph"; grep -E "decode_graph_replay_ms|decode_step_wall_ms" "$out/r/prof_b1.txt"
echo "== nano-vllm workload"; grep -h "^pagedrt " "$out/r/nanovllm.txt" | head -3
for dt in fp8 auto; do
  [ -f "$out/r/ncu_$dt.txt" ] && { echo "== ncu, $dt"; grep -E "Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Eligible Warps|No Eligible|Achieved Occupancy|Registers Per|Executed Ipc A" "$out/r/ncu_$dt.txt" | head -14; }
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
