#!/usr/bin/env bash
# The GPU test files that have not run since auto multi-step became the default (f0fd17e; the
# five of call_s158.sh passed on an H100 at 1e8670a, benchmarks/results/RUNS.md "Runs of
# 2026-12-07 (23:48-23:58 UTC)"): every other file of tests/gpu in four pytest processes at
# once (gpu_tests_sharded, CAP s each, 420 by default), then the Triton cache saved into $OUT
# (tc.txz.NN) and the logs packed into $OUT/results.tgz, which the transfer keeps whole.
# Carry .commit, .whl and .tcache where it holds an earlier call's cache parts; ~9 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
done_files="multi_step graph_inputs smoke beam_search spec_decode"
files=""
for f in tests/gpu/test_*_gpu.py; do
  name=${f#tests/gpu/test_}; name=${name%_gpu.py}
  case " $done_files " in *" $name "*) ;; *) files="$files $f" ;; esac
done
echo "files: $files"
gpu_tests_sharded rest "${CAP:-420}" 4 $files 2>&1 | tee "$out/r/summary.txt"
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
