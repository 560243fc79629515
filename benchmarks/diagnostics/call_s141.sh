#!/usr/bin/env bash
# The narrow matmul tiles on the next GPU, either card, one call (carry .commit, .whl and
# .tcache; ~8 min): first `tests/gpu/test_matmul_gpu.py` (every CONFIGS entry, the narrow tiles
# among them, against cuBLAS in bf16; split-K in a replayed graph; the SwiGLU and RoPE
# epilogues against the plain path; engine tokens with and without the tiled matmul), then
# the comparison at 8, 16, 32 and 64 rows: `matmul_graphs.py --variants wide,on`
# with PAGEDRT_CONFIG_CACHE=off and PAGEDRT_TIMING_REP_MS=5, the decode graphs with and without
# the narrow tiles in one process. If the graphs are not faster with them, take them out of
# CONFIGS (docs/design.md, "Decode matmuls (8 to 128 rows)"; run on an H100 on 2026-12-07 at 8
# and 32 rows: kept, benchmarks/results/RUNS.md). Everything in
# $OUT/results.tgz. TESTS_CAP (seconds, default 200) and BATCHES (default 8,16,32,64) shorten
# it where little device time is left; EXTRA_TESTS (test files) adds GPU tests at the end. Without a carried .tcache (a fresh checkout has none)
# the candidates are compiled in 8 warming processes before the graphs (WARM_CAP, default 120
# s; 0 skips it), and the Triton cache comes back in $OUT/tc.txz.NN for the next call.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
PAGEDRT_TIMING_REP_MS=2 gpu_tests matmul_gpu "${TESTS_CAP:-200}" tests/gpu/test_matmul_gpu.py
[ -d .tcache ] || [ "${WARM_CAP:-120}" = 0 ] || warm_qwen2_cache "${WARM_CAP:-120}"
t0=$SECONDS
PAGEDRT_CONFIG_CACHE=off PAGEDRT_TIMING_REP_MS=5 timeout 300 python3 \
  benchmarks/diagnostics/matmul_graphs.py --batch-sizes "${BATCHES:-8,16,32,64}" --variants wide,on \
  > "$out/r/graphs.txt" 2>&1
echo "graphs status $? in $((SECONDS - t0)) s"
grep -vE "^  \(" "$out/r/graphs.txt" | tail -12
# EXTRA_TESTS: more GPU test files, run last (capped at 150 s)
[ -z "${EXTRA_TESTS:-}" ] || gpu_tests extra 150 $EXTRA_TESTS
[ -d .tcache ] || save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
