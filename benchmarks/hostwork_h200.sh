#!/usr/bin/env bash
# Issue 16, host work per step (about 3.5 minutes on a warm H200): the host time of a 256-row
# decode step with each sampling setting, on this machine's CPU with a stub model
# (benchmarks/host_step_cpu.py, no GPU work), then Qwen2-0.5B on the nano-vllm workload with
# its own sampling (temperature 0.6), with penalties, and with top-k/top-p/min-p, through
# `pagedrt bench throughput` (output tok/s; trace_summary.py prints the decode step's wall /
# device time and the host time per phase of a 256-row step). Run from the repository root:
#
#   bash benchmarks/hostwork_h200.sh        # results under $OUT (or ./out)
#
# Compare with the same commands at main (without --sampling) for the before figures.
set -u  # keep going past a failing step: each prints its own result
out="${OUT:-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/hostwork_h200.log"
bench() { timeout "$cap" python3 -m pagedrt.entrypoints.cli bench "$@" --out "$out" >> "$log" 2>&1; }
for s in greedy nanovllm filters penalties mixed; do
    timeout 40 python3 benchmarks/host_step_cpu.py --sampling "$s" --steps 150 --async \
        --json "$out/host_step_$s.json" | tee -a "$log"
done
cap=100 bench throughput --preset qwen2-0.5b --workload nanovllm --name nanovllm_qwen2
cap=60 bench throughput --preset qwen2-0.5b --workload nanovllm --sampling penalties \
    --skip-step-split --warm-up-requests 32 --name nanovllm_qwen2_penalties
cap=60 bench throughput --preset qwen2-0.5b --workload nanovllm --sampling filters \
    --skip-step-split --warm-up-requests 32 --name nanovllm_qwen2_filters
python3 benchmarks/trace_summary.py "$out" 2>&1 | tee -a "$log"
