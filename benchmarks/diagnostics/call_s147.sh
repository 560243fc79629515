#!/usr/bin/env bash
# call_s146.sh's batch-1 A/B again on a warm cache (both trees' choices in the config cache
# the previous call saved; carry .commit, .whl, .tcache and .base; ~3 min): ABBA twice, one
# `pagedrt bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3`
# process each, base 9f4b5df against this tree.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
lat_tree() {  # tree (base|head), name, cap
  local path=$PWD commit=$PAGEDRT_COMMIT t0=$SECONDS
  [ "$1" = base ] && path=$PWD/.base commit=9f4b5df
  (cd "$path" && PAGEDRT_COMMIT=$commit PYTHONPATH="$path" timeout "$3" python3 -m \
    pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b --contexts 512,4096 \
    --graphs on --repeats 3 --name "$2" --out "$out/r") > "$out/r/$2.txt" 2>&1
  echo "$2 status $? in $((SECONDS - t0))s: $(grep -E "batch1" "$out/r/$2.txt" \
    | tr -s " " | cut -d" " -f4,6 | tr "\n" " ")"
  python3 - "$out/r/$2.json" <<'PY' 2>/dev/null
import json, sys
for name, table in json.load(open(sys.argv[1])).get("kernel_choices", {}).items():
    for k, v in table.items():
        if ", 1, " in k:
            print("   ", k[:64], "->", v)
PY
}
lat_tree base lat_base_1 60
lat_tree head lat_head_2 60
lat_tree head lat_head_3 60
lat_tree base lat_base_4 60
lat_tree base lat_base_5 60
lat_tree head lat_head_6 60
lat_tree head lat_head_7 60
lat_tree base lat_base_8 60
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
