#!/usr/bin/env bash
# The decode step by kernel at 256, 64 and 8 rows with decode_timeline.py's steady window
# (e2899c0: exactly --steps decode steps of the whole batch; call_s98's windows held the
# shrinking tail of smaller batches), for issue 16's 256-row and batch 8 / 32 / 64 targets
# (carry .commit, .whl and .tcache; ~7 min on a fresh machine). Then the Triton cache is
# returned as $OUT/tc.txz.NN for the next call's .tcache/. Totals printed, then the kernel
# tables; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
timeline_run 256 16 200
timeline_run 64 16 120
timeline_run 8 16 100
for b in 256 64 8; do echo "== tl_b$b"; sed -n '/exposed/,$p' "$out/r/tl_b$b.txt" | head -26 | cut -c1-150; done
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
