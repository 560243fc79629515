#!/usr/bin/env bash
# Seeded sampling's counter-based draws on the H200 (docs/design.md, "Seeded sampling"; ~6 min).
# Before the call, here:
#   git rev-parse --short HEAD > .commit
#   rm -rf .base && mkdir .base && git archive f2c416c pagedrt | tar -x -C .base   # git-ignored
# and carry .commit, .whl, .tcache and .base. Runs the GPU tests of the kernel, the sampler's
# race and speculative decoding, then Qwen2-0.5B 256 x 512/128 with a seed per request
# (`--sampling seeded`, temperature 0.6) and without (`--sampling nanovllm`), f2c416c (one
# torch.Generator per seeded row: a launch per row per step) and this tree in turn, twice:
# output tok/s and the step split's host ms per decode step.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests philox 300 tests/gpu/test_philox_gpu.py tests/gpu/test_sample_triton_gpu.py \
  tests/gpu/test_spec_decode_gpu.py
for round in 1 2; do
  for tree in base new; do
    path=$PWD commit=$PAGEDRT_COMMIT
    [ "$tree" = base ] && path=$PWD/.base commit=f2c416c
    for s in seeded nanovllm; do
      name="${tree}_${s}_$round"
      (cd "$path" && PAGEDRT_COMMIT=$commit PYTHONPATH="$path" timeout 150 python3 -m \
        pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b --sampling "$s" \
        --num-requests 256 --input-len 512 --output-len 128 --name "$name" --out "$out/r") \
        > "$out/r/$name.txt" 2>&1
      echo "$name status $?: $(grep -E "^pagedrt +qwen|host" "$out/r/$name.txt" | tr -s ' ' \
        | head -3 | tr '\n' ' ')"
    done
  done
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
