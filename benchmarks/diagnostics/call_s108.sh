#!/usr/bin/env bash
# prefill_parts.py again (the extend configs at 32 x 512, 16 x 1,024 and 4 x 4,096 tokens of
# Qwen2-0.5B's heads; gate/up with SwiGLU's activation in the matmul's epilogue at 16,384 and
# 4,096 rows against cuBLAS + the activation kernel; compiled in 8 shards first), then every
# GPU test in four processes at once (call_s103's, capped at 400 s) and the Triton cache back
# ($OUT/tc.txz.*: put them in .tcache/). Carry .commit, .whl, .tcache; ~9.5 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
for i in 0 1 2 3 4 5 6 7; do
  timeout 100 python3 benchmarks/diagnostics/prefill_parts.py --out "$out/r/pp_shard" \
    --shard $i/8 > "$out/r/pp_shard$i.txt" 2>&1 &
done
wait
timeout 120 python3 -u benchmarks/diagnostics/prefill_parts.py --out "$out/r/pp" \
  > "$out/r/pp.txt" 2>&1
echo "== prefill_parts (status $?) at ${SECONDS}s"
gpu_tests_sharded gpu 400 4 tests/gpu
save_triton_cache
grep -v "^ *$" "$out/r/pp.txt" | tail -40 | cut -c1-180
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
