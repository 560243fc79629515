#!/usr/bin/env bash
# 2026-12-03 06:45 UTC (carry .commit, .whl, .gguf_parts/p3, .gguf_parts/md5; after call_s38
# and the p2 call). call_s37's accuracy step ran out of its 40 s: rerun it alone, 120 s.
set -u
cat /tmp/gg/p1 /tmp/gg/p2 .gguf_parts/p3 > /tmp/smollm2.gguf
[ "$(md5sum < /tmp/smollm2.gguf | cut -d' ' -f1)" = "$(cat .gguf_parts/md5)" ] || echo "GGUF md5 differs"
export PAGEDRT_COMMIT="$(cat .commit)"
. benchmarks/use_wheels.sh
SMOLLM2_GGUF=/tmp/smollm2.gguf FP8KV_STEPS=accuracy OUT="$OUT" bash benchmarks/fp8kv_h200.sh
tail -3 "$OUT/fp8kv_h200.log"
