#!/usr/bin/env bash
# The margin a fused 1-4-row op needs over its chain (PAGEDRT_FUSED_MARGIN, issue 16): in
# call_s119 the start-up timing kept the RMSNorm before gate/up as a kernel of its own at batch
# 1 (25 norm launches a step, 35.7 us exposed), where earlier in-step runs found every fused
# tile but one faster than the chain. Batch-1 latency with the default 0.95 against 1.0 (the
# fused op taken wherever it times faster at all) and 1.05, each process timing afresh (its own
# config-cache folder), ABAB; each run's 1-row fused choices and their timed ms printed. One
# GPU; carry .commit, .whl and .tcache; ~5 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
lat() {  # name, margin, cap
  local t0=$SECONDS
  PAGEDRT_CONFIG_CACHE=/tmp/cc_$1 PAGEDRT_FUSED_MARGIN=$2 timeout "$3" python3 -m \
    pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on \
    --repeats 3 --name "lat_$1" --out "$out/r" > "$out/r/lat_$1.txt" 2>&1
  echo "lat_$1 (PAGEDRT_FUSED_MARGIN=$2) status $? in $((SECONDS - t0))s: $(grep -E \
    "batch1" "$out/r/lat_$1.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
  cp /tmp/cc_$1/*.jsonl "$out/r/choices_$1.jsonl" 2>/dev/null
  python3 - "$out/r/choices_$1.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    key = str(d.get("key"))
    if "_FUSED_CHOICE" in str(d.get("table")) and d.get("rows") == 1:
        chain = [ms for c, ms in d["times"] if c is None]
        best = sorted(d["times"], key=lambda t: t[1])[:3]
        print(f"    {key[:40]:40} -> {d.get('config')}  us: chain "
              f"{1e3 * chain[0] if chain else float('nan'):.2f}, fastest "
              + ", ".join(f"{c}: {1e3 * ms:.2f}" for c, ms in best))
PY
}
lat m095a 0.95 120
lat m100a 1.0 120
lat m095b 0.95 120
lat m100b 1.0 120
[ $SECONDS -lt 420 ] && lat m105a 1.05 120
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
