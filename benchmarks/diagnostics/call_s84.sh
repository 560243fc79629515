#!/usr/bin/env bash
# Issue 16, batch 1, for the next lease (carry .commit and .whl, and .tcache when a call has
# saved one; ~9 min): is the start-up timing's PDL lead (PAGEDRT_TIMING_LEAD=1, opt-in since
# da771ce) a better chooser of the batch-1 tiles? Batch-1 latency at ctx 512 / 4,096 from
# fresh engines, default and lead alternating (the first run pays the compiles), each run's
# 1-row choices printed; then the Triton cache saved for the next call (save_triton_cache).
# call_s82 measured 0.608 / 0.651 ms with the lead and gate/up (16, 256, 4), 0.648 / 0.689
# with (8, 256, 4); call_s81 forced-tile table: (16, 256, 4) is the step's fastest.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
lat() {  # name, cap, extra environment
  local t0=$SECONDS
  env $3 timeout "$2" python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
    --contexts 512,4096 --graphs on --repeats 3 --name "lat_$1" --out "$out/r" \
    > "$out/r/lat_$1.txt" 2>&1
  echo "lat_$1 status $? in $((SECONDS - t0))s: $(grep -E "batch1" "$out/r/lat_$1.txt" \
    | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
  python3 - "$out/r/lat_$1.json" <<'PY' 2>/dev/null
import json, sys
for table in json.load(open(sys.argv[1])).get("kernel_choices", {}).values():
    for k, v in table.items():
        if ", 1, " in k:
            print("   ", k[:72], "->", v)
PY
}
lat default1 250 ""
lat lead1 80 PAGEDRT_TIMING_LEAD=1
lat default2 80 ""
lat lead2 80 PAGEDRT_TIMING_LEAD=1
rm -f "$out"/r/*.png
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
