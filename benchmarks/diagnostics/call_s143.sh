#!/usr/bin/env bash
# The token controls' sampler changes (prompt logprobs, logit_bias / allowed_token_ids, bad
# words: 043c96c..HEAD touched sample_rows and the model runner's step) against the tree
# before them, on nano-vllm's sampled workload, where every step runs sample_rows (carry
# .commit, .whl, .tcache and .base; ~5 min, either card). Before the call, here:
#   git rev-parse --short HEAD > .commit
#   rm -rf .base && mkdir .base && git archive 043c96c pagedrt | tar -x -C .base   # git-ignored
# Triton's cache warmed (warm_qwen2_cache), then `pagedrt bench throughput --preset qwen2-0.5b
# --workload nanovllm --skip-step-split` in ABBA order, base and this tree, one process each.
# Summary lines last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
warm_qwen2_cache "${WARM_CAP:-60}"
run_tree() {  # tree (base|head), name, cap
  local path=$PWD commit=$PAGEDRT_COMMIT t0=$SECONDS
  [ "$1" = base ] && path=$PWD/.base commit=043c96c
  (cd "$path" && PAGEDRT_COMMIT=$commit PYTHONPATH="$path" timeout "$3" python3 -m \
    pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b --workload nanovllm \
    --skip-step-split --name "$2" --out "$out/r") > "$out/r/$2.txt" 2>&1
  echo "$2 status $? in $((SECONDS - t0))s: $(grep -E "^pagedrt +qwen" "$out/r/$2.txt" \
    | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
run_tree base base_1 "${CAP:-90}"
run_tree head head_1 "${CAP:-90}"
run_tree head head_2 "${CAP:-90}"
run_tree base base_2 "${CAP:-90}"
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
