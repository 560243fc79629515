#!/usr/bin/env bash
# Why call_s118 saw no gain from the early reads (issue 16): batch-1 latency of HEAD with
# PAGEDRT_DECODE_EARLY=1 and =0 against `49cf470` (carried as .base/: the first early-read
# version, whose tile loop read V before the scores, +1.3-1.5% against the tree before it in
# call_s116), in ABAB order; the base starts from HEAD's timed choices (its config-cache file
# is a copy of HEAD's), so the trees differ only in their attention. Then the decode step's
# timeline at batches 1, 8 and 64 (decode_timeline.py), where the step's device time goes on an
# H100 now. One GPU; carry .commit, .whl, .tcache and .base; ~6 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
lat() {  # name, tree (head|base), PAGEDRT_DECODE_EARLY, cap
  local t0=$SECONDS name=$1 dir=. early=$3
  [ "$2" = base ] && dir=.base
  (cd "$dir" && PYTHONPATH=$PWD PAGEDRT_DECODE_EARLY=$early timeout "$4" python3 -m \
    pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on \
    --repeats 3 --name "lat_$name" --out "$out/r" > "$out/r/lat_$name.txt" 2>&1)
  echo "lat_$name ($2, PAGEDRT_DECODE_EARLY=$early) status $? in $((SECONDS - t0))s: $(grep \
    -E "batch1" "$out/r/lat_$name.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
}
cfg_file() {  # tree dir: the config-cache file its fingerprint names on this GPU
  (cd "$1" && PYTHONPATH=$PWD python3 -c "from pagedrt.ops import config_cache as c
print(c.cache_file(c.cache_directory(), c.fingerprint(0)))")
}
lat head_on1 head 1 150
head_cfg=$(cfg_file .); base_cfg=$(cfg_file .base)
cp "$head_cfg" "$base_cfg" && echo "base starts from HEAD's choices: $(wc -l < "$base_cfg") lines"
lat base1 base 1 150
lat head_off1 head 0 70
lat head_on2 head 1 70
lat base2 base 1 70
lat head_off2 head 0 70
for b in 1 8 64; do
  [ $SECONDS -lt 480 ] && timeline_run $b 32 100
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
