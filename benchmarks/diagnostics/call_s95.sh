#!/usr/bin/env bash
# The rest of call_s93.sh's GPU tests (carry .commit, .whl and .tcache; ~8 min): call_s93 ran
# `pytest -m gpu tests/gpu` in one process and its 400 s cap ended after 72 of 184 tests
# (beam search, the fused reduce, 8 of test_decode_gpu; one failure, the counters test's
# stale message match, mended). Here the files after those run as four pytest processes at
# once on the one GPU (Triton's compiles are CPU work, 16 cores), each capped at 450 s; the
# engine tests size their caches by num_kv_blocks, so they share the GPU's memory. Failures
# and summaries last; every file's output in $OUT/results.tgz; the Triton cache into
# $OUT/tc.txz.NN.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
g=tests/gpu
shard() {  # name, files...
  local name=$1
  shift
  timeout 450 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE "$@" > "$out/r/$name.txt" 2>&1
  echo "$name status $?" >> "$out/r/status.txt"
}
shard s1 $g/test_decode_gpu.py $g/test_extend_decode_rows_gpu.py $g/test_pdl_early_reads_gpu.py \
  $g/test_pdl_gpu.py &
shard s2 $g/test_fp8_kv_gpu.py $g/test_philox_gpu.py $g/test_smoke_gpu.py &
shard s3 $g/test_fused_small_batch_gpu.py $g/test_graph_inputs_gpu.py $g/test_sample_triton_gpu.py &
shard s4 "$g/test_decode_fused_reduce_gpu.py::test_capture_needing_more_counters_raises" \
  $g/test_spec_decode_gpu.py $g/test_window_gpu.py $g/test_matmul_gpu.py $g/test_tp_gpu.py &
wait
for s in s1 s2 s3 s4; do
  echo "== $s: $(grep "^$s " "$out/r/status.txt")"
  grep -E "^(FAILED|ERROR)|passed|failed|^tests/gpu/[a-z_]+\.py " "$out/r/$s.txt" | tail -10 | cut -c1-220
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
save_triton_cache
