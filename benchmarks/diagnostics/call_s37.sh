#!/usr/bin/env bash
# 2026-12-03 06:50 UTC (carry .commit, .whl, .gguf_parts/p3, .gguf_parts/md5; right after
# call_s36, which left p1 and p2 in /tmp/gg). Issue 17's record under the warp-tile FP8
# default: benchmarks/fp8kv_h200.sh with the decode-heavy 128 x 2048/1024 (A) and
# 64 x 7680/512 (B), 150 s each.
set -u
cat /tmp/gg/p1 /tmp/gg/p2 .gguf_parts/p3 > /tmp/smollm2.gguf
[ "$(md5sum < /tmp/smollm2.gguf | cut -d' ' -f1)" = "$(cat .gguf_parts/md5)" ] || echo "GGUF md5 differs"
export PAGEDRT_COMMIT="$(cat .commit)"
. benchmarks/use_wheels.sh
SMOLLM2_GGUF=/tmp/smollm2.gguf THROUGHPUT_A="128 2048 1024" THROUGHPUT_B="64 7680 512" \
  THROUGHPUT_TIMEOUT=150 OUT="$OUT" bash benchmarks/fp8kv_h200.sh
tail -5 "$OUT/fp8kv_h200.log"
