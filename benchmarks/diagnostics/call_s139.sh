#!/usr/bin/env bash
# The narrow matmul tiles in the engine (carry .commit, .whl, .tcache and .base; ~7 min, either
# card). Before the call, here:
#   git rev-parse --short HEAD > .commit
#   rm -rf .base && mkdir .base && git archive 205395f pagedrt | tar -x -C .base   # git-ignored
# Triton's cache warmed for this tree (warm_qwen2_cache), then the batch sweep at 8, 16, 32
# and 64 rows (`pagedrt bench throughput --preset qwen2-0.5b --skip-step-split --batch-sizes
# 8,16,32,64 --repeats 2`, 256 x 512/128 first) in ABBA order: 205395f (CONFIGS without the
# narrow tiles) and this tree. The first process of each tree times its kernel choices into
# the config cache, the second reads them. Summary lines last; everything in
# $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
warm_qwen2_cache 70
run_tree() {  # tree (base|head), name, cap
  local path=$PWD commit=$PAGEDRT_COMMIT t0=$SECONDS
  [ "$1" = base ] && path=$PWD/.base commit=205395f
  (cd "$path" && PAGEDRT_COMMIT=$commit PYTHONPATH="$path" timeout "$3" python3 -m \
    pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b --skip-step-split \
    --batch-sizes 8,16,32,64 --repeats 2 --name "$2" --out "$out/r") > "$out/r/$2.txt" 2>&1
  echo "$2 status $? in $((SECONDS - t0))s: $(grep -E "^pagedrt +qwen" "$out/r/$2.txt" \
    | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
run_tree base base_1 120
run_tree head head_1 140
run_tree head head_2 70
run_tree base base_2 70
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
