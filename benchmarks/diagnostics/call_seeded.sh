#!/usr/bin/env bash
# Seeded sampling's counter-based draws on the H200 (docs/design.md, "Seeded sampling"; ~8 min).
# Before the call, here:
#   git rev-parse --short HEAD > .commit
#   rm -rf .base && mkdir .base && git archive f2c416c pagedrt | tar -x -C .base   # git-ignored
# and carry .commit, .whl, .tcache and .base. Runs the GPU tests of the kernel, the sampler's
# race and speculative decoding, then Qwen2-0.5B 256 x 512/128 with a seed per request
# (`--sampling seeded`, temperature 0.6; f2c416c, one torch.Generator per seeded row: a launch
# per row per step, and this tree in ABBA order) and without (`--sampling nanovllm`, once each):
# output tok/s and the step split's host ms per decode step. This tree runs with
# PAGEDRT_STAGED_GRAPH_INPUTS=0 (f2c416c's graph inputs), so that only the sampling differs,
# and once more with the staged inputs on nano-vllm's sampling (`new_nanovllm_staged`).
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests sampling 120 tests/gpu/test_sample_triton_gpu.py tests/gpu/test_spec_decode_gpu.py
run_one() {  # tree (base|new|staged), sampling, name
  local path=$PWD commit=$PAGEDRT_COMMIT staged=0
  [ "$1" = base ] && path=$PWD/.base commit=f2c416c
  [ "$1" = staged ] && staged=1
  (cd "$path" && PAGEDRT_STAGED_GRAPH_INPUTS=$staged PAGEDRT_COMMIT=$commit PYTHONPATH="$path" \
    timeout 100 python3 -m \
    pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b --sampling "$2" \
    --num-requests 256 --input-len 512 --output-len 128 --name "$3" --out "$out/r") \
    > "$out/r/$3.txt" 2>&1
  echo "$3 status $?: $(grep -E "^pagedrt +qwen|host" "$out/r/$3.txt" | tr -s ' ' | head -3 \
    | tr '\n' ' ')"
}
# seeded in ABBA order, then the unseeded control once each way
run_one base seeded base_seeded_1
run_one new seeded new_seeded_1
run_one new seeded new_seeded_2
run_one base seeded base_seeded_2
run_one new nanovllm new_nanovllm
run_one base nanovllm base_nanovllm
run_one staged nanovllm new_nanovllm_staged
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
