#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit and .whl; the session's last ~9 min): HEAD's start-up
# timing in rounds with the PDL lead: batch-1 latency at ctx 512 / 4,096 from three fresh
# engines (each makes its own choices, printed: are they stable now), then the whole
# tests/gpu/test_fused_small_batch_gpu.py (the combine-in-O engine test did not finish in
# call_s82).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
lat() {  # name, cap
  local t0=$SECONDS
  timeout "$2" python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
    --contexts 512,4096 --graphs on --repeats 3 --name "lat_$1" --out "$out/r" \
    > "$out/r/lat_$1.txt" 2>&1
  echo "lat_$1 status $? in $((SECONDS - t0))s: $(grep -E "batch1" "$out/r/lat_$1.txt" \
    | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
  python3 - "$out/r/lat_$1.json" <<'PY' 2>/dev/null
import json, sys
for table in json.load(open(sys.argv[1])).get("kernel_choices", {}).values():
    for k, v in table.items():
        if ", 1, " in k and ("9728" in k or "silu_mul" in k or "attn_combine" in k
                             or "(896, 896)" in k or "1152" in k):
            print("   ", k[:72], "->", v)
PY
}
lat 1 250
lat 2 80
lat 3 80
gpu_tests gpu_fused 130 tests/gpu/test_fused_small_batch_gpu.py
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
