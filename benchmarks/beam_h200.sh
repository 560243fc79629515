#!/usr/bin/env bash
# Issue 20 (beam search in the engine) on the H200, in one device call of about 2-3 minutes.
# Run from the repository root on the GPU machine:
#
#   OUT=/some/folder bash benchmarks/beam_h200.sh        # results under $OUT (or ./out)
#   BEAM_TESTS=0 ...                                     # without step 1
#   BEAM_AB=1 ...                                        # also step 3 (about 1 minute more)
#
# 1. tests/gpu/test_beam_search_gpu.py: beam search on CUDA (Triton attention, CUDA graphs,
#    async scheduling with its on-device table patch and partial-block copies, the Triton
#    choice kernel of pagedrt/ops/beam_triton.py) equals the CPU engine and HF
#    generate(num_beams=W), also under preemption.
# 2. Qwen2-0.5B shape, random weights, bf16: 64 prompts x 512 tokens, 128 new tokens, width 4:
#    beam search against n = 4 sampling of the same prompts (median of 3 runs each, in turn),
#    and against HF generate(num_beams=4) at the largest of 64, 32, 16 prompts per batch that
#    fits. Targets (issue 20): beam >= 0.8x of n = 4 sampling, >= 10x HF. Output tokens count
#    width x tokens for every system. Should it fail, it runs again with the choice in torch
#    ops (PAGEDRT_BEAM_KERNEL=0) and without HF.
# 3. (BEAM_AB=1) step 2 with PAGEDRT_BEAM_KERNEL=0, without HF: the kernel's share.
# The short table (tok/s, decode step wall and device ms, host syncs and pinned allocations
# per decode step, host ms per phase, beam / n=4 ratio) comes last.
set -u  # keep going past a failing step: each prints its own result
out="${OUT:-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/beam_h200.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$log"
if [ "${BEAM_TESTS:-1}" = 1 ]; then  # (issues_h200.sh has run every GPU test already)
  timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_beam_search_gpu.py -p no:cacheprovider \
      2>&1 | tee -a "$log" | tail -3
fi
bench() {  # name, extra args...
  local name=$1
  shift
  timeout 200 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
      --num-requests 64 --input-len 512 --output-len 128 --beam-width 4 \
      --out "$out" --name "$name" "$@" > "$out/$name.log" 2>&1
  local status=$?
  cat "$out/$name.log" >> "$log"
  if [ "$status" -ne 0 ]; then
    echo "bench $name failed ($status): $out/$name.log"
    tail -20 "$out/$name.log"
  fi
  return "$status"
}
if [ "${BEAM_AB:-0}" = 1 ]; then
  PAGEDRT_BEAM_KERNEL=0 bench beam_qwen2_torch_choice && {
    echo "--- the choice in torch ops (PAGEDRT_BEAM_KERNEL=0):"
    grep -A8 "^system" "$out/beam_qwen2_torch_choice.log"; }
fi
if bench beam_qwen2 --compare hf --hf-batch-sizes 64,32,16; then
  echo "--- the choice in the Triton kernel (the default):"
  grep -A8 "^system" "$out/beam_qwen2.log"
elif [ "${BEAM_AB:-0}" != 1 ]; then
  PAGEDRT_BEAM_KERNEL=0 bench beam_qwen2_torch_choice && {
    echo "--- the choice in torch ops (PAGEDRT_BEAM_KERNEL=0):"
    grep -A8 "^system" "$out/beam_qwen2_torch_choice.log"; }
fi
