#!/usr/bin/env bash
# Where GPU tests that run past their caps spend their time (carry .commit, .whl, .tcache;
# ~2 min): each test id given (by default the three engine tests that no sharded call has seen
# finish) in its own pytest process at once, with faulthandler dumping every thread's stack at
# 70 s and SIGINT at 105 s; $OUT/stuck_N.txt, the innermost frames printed. On 2026-12-06 all
# three were timing kernel configs at engine start-up (config_timing.fastest_config replays),
# which led to PAGEDRT_TIMING_REP_MS in the GPU tests (tests/gpu/conftest.py).
set -u
. benchmarks/diagnostics/call_common.sh > /dev/null 2>&1
[ $# -gt 0 ] || set -- \
  tests/gpu/test_spec_decode_gpu.py::test_verification_graph_decode_rows_match_extend_on_cuda \
  tests/gpu/test_pdl_gpu.py::test_engine_tokens_with_and_without_pdl \
  tests/gpu/test_fused_small_batch_gpu.py::test_engine_tokens_with_the_in_step_timing
i=0
for t in "$@"; do
  (timeout -s INT -k 5 105 python3 -m pytest -v -m gpu -p no:cacheprovider \
     -o faulthandler_timeout=70 "$t" > "$out/stuck_$i.txt" 2>&1
   echo "status $?" >> "$out/stuck_$i.txt") &
  i=$((i + 1))
done
wait
for j in $(seq 0 $((i - 1))); do
  echo "=== $j"
  grep -E "PASSED|FAILED|status|Timeout" "$out/stuck_$j.txt" | head -5
  grep -A30 "Thread 0x" "$out/stuck_$j.txt" | grep "File" | head -14 | cut -c1-150
done
