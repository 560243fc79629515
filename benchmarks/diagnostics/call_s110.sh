#!/usr/bin/env bash
# The first call of a lease on a fresh machine (carry .commit, .whl and .tcache if there is one;
# ~6 min): Triton's cache warmed by 8 PAGEDRT_WARM_SHARD processes over a small Qwen2-0.5B
# workload (warm_cache), then the status runs on it: 256 x 512/128 with --repeats 2 (its wall
# time says whether the warming left anything to compile: on 2026-12-06 a cold machine's run
# was cut at 90 s, a warm one's took 69-75 s), the batch sweep of record and batch-1 latency;
# then the Triton cache back ($OUT/tc.txz.NN: put them in .tcache/). Summaries last;
# everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
warm_qwen2_cache 200
grep -l "Traceback\|Error" "$out"/r/warm_*.txt | head -3
t0=$SECONDS
timeout 150 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
  --skip-step-split --repeats 2 --name main --out "$out/r" > "$out/r/main.txt" 2>&1
echo "main status $? in $((SECONDS - t0))s: $(grep -h "output tok/s of each\|prefill steps" \
  "$out/r/main.txt" | tr -s ' ' | cut -c1-110 | tr '\n' ' ')"
sweep head
latency_run head 150
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
