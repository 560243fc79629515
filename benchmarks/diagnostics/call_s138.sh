#!/usr/bin/env bash
# Narrow swapped tiles for the 8-64-row decode matmul (carry .commit, .whl and .tcache; ~5 min,
# either card): `benchmarks/matmul_tune.py --grid narrow` over Qwen2-0.5B's QKV, O, gate/up
# (plain and with SwiGLU's activation) and down at 8, 16, 32 and 64 rows, each config checked
# against F.linear and timed cold and hot against cuBLAS and CONFIGS (the engine's candidates)
# in the same process. Compiled first in 14 shards at once. Summary last; everything in
# $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
args=(--grid narrow --models qwen2-0.5b --rows 8,16,32,64
      --ops qkv,o,gate_up,gate_up_silu,down)
t0=$SECONDS
for i in $(seq 0 13); do
  timeout 170 python3 benchmarks/matmul_tune.py "${args[@]}" --out "$out/r/narrow" \
    --shard "$i/14" > "$out/r/compile_$i.txt" 2>&1 &
done
wait
echo "compiled in $((SECONDS - t0)) s, $(ls "$tcache" | wc -l) cache entries"
t0=$SECONDS
timeout 330 python3 benchmarks/matmul_tune.py "${args[@]}" --out "$out/r/narrow" \
  > "$out/r/narrow.txt" 2>&1
echo "timed: status $? in $((SECONDS - t0)) s"
grep -E "^qwen2" "$out/r/narrow.txt" | tr -s ' '
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
