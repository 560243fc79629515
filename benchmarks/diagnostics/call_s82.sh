#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit, .whl and .base = `git archive f8fe4af pagedrt`, the tree
# before e47669e; ~8 min): the attention's split-K combine in the O projection's prologue and
# the start-up timing's PDL lead kernel. The new GPU tests first, then batch-1 latency at ctx
# 512 / 4,096 in the order new, base, new without the lead, new without the combine, new,
# base (each its own engine, so each makes its own start-up choices: printed per run), then
# the batch-1 step's timeline by kernel with HEAD.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests gpu_combine 200 tests/gpu/test_fused_small_batch_gpu.py -k combine
lat() {  # name, tree directory, extra environment
  (cd "$2" && env $3 PYTHONPATH="/tmp/site:$PWD" timeout 120 python3 -m pagedrt.entrypoints.cli \
    bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 \
    --name "lat_$1" --out "$out/r" > "$out/r/lat_$1.txt" 2>&1)
  echo "lat_$1 status $? at ${SECONDS}s: $(grep -E "batch1" "$out/r/lat_$1.txt" | tr -s ' ' \
    | cut -d' ' -f4,6 | tr '\n' ' ')"
  python3 - "$out/r/lat_$1.json" <<'PY' 2>/dev/null
import json, sys
ch = json.load(open(sys.argv[1])).get("kernel_choices", {})
for table in ch.values() if isinstance(ch, dict) else []:
    if isinstance(table, dict):
        for k, v in table.items():
            if ("9728" in k or "silu_mul" in k or "attn_combine" in k) and ", 1, " in k:
                print("   ", k[:70], "->", v)
PY
}
lat new1 . ""
lat base1 .base ""
lat nolead . PAGEDRT_TIMING_LEAD=0
lat nocomb . PAGEDRT_FUSED_ATTN_COMBINE=0
lat new2 . ""
lat base2 .base ""
timeout 100 python3 benchmarks/diagnostics/decode_timeline.py --batch 1 --context 512 \
  --steps 32 --out "$out/r/tl_b1.json" > "$out/r/tl_b1.txt" 2>&1
echo "tl_b1 status $? at ${SECONDS}s"; grep -vE "Warn|warn" "$out/r/tl_b1.txt" | head -16
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
