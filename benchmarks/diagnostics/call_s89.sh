#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit, .whl, .tcache; ~7 min): call_s88 measured 0.65-0.89
# ms/token from engines with the same tiles, the in-step timing's graph replay 0.56 ms. Per-step
# wall times of the latency loop in one process (batch1_steps.py), two more latency runs from
# fresh processes, the batch-1 device timeline, then the in-step timing's GPU test (timed out
# compiling in call_s88; the cache is carried now).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
cat /proc/cpuinfo | grep "model name" | head -1; nproc
timeout 120 python3 benchmarks/diagnostics/batch1_steps.py > "$out/r/b1steps.txt" 2>&1
echo "b1steps status $?"; grep -E "^(run|nogc|warm|loadavg)" "$out/r/b1steps.txt"
latency_run default3 60 "" | head -1
latency_run default4 60 "" | head -1
timeline_run 1 64 100
grep -A12 "^kernel" "$out/r/tl_b1.txt"
gpu_tests gpu_step_timing 170 tests/gpu/test_fused_small_batch_gpu.py -k in_step_timing
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
