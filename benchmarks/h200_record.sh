#!/usr/bin/env bash
# The issue-6 figures in one device call (about 6 minutes on a warm H200): engine smoke check,
# Qwen2-0.5B throughput with the HF peers and the batch sweep, three repeats of it without
# peers, batch-1 latency with HF (the default: auto multi-step) and with one pass, the
# nano-vllm workload, and the Llama-3-8B shape. Run from the repository root on the GPU machine:
#
#   PAGEDRT_COMMIT=<hash> bash benchmarks/h200_record.sh      # results under $OUT (or ./out)
#
# The SmolLM2-vs-HF check needs the GGUF and the gguf wheel (benchmarks/README.md) and runs
# separately: python3 benchmarks/gpu_engine_check.py --smollm2 PATH.gguf
set -u  # keep going past a failing step: each prints its own result
out="${OUT:-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/h200_record.log"  # the full output of every step; the terminal gets the summary lines
bench() { python3 -m pagedrt.entrypoints.cli bench "$@" --out "$out" 2>&1 | tee -a "$log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 benchmarks/gpu_engine_check.py --smoke --out "$out" 2>&1 | tee -a "$log" | grep -E "PASS|FAIL|passed"
bench throughput --preset qwen2-0.5b --compare hf --hf-batch-sizes 64,256 \
    --batch-sizes 1,8,32,64,128 --name throughput_qwen2 2>&1 | grep -v -i warn | tail -15
for i in 1 2 3; do  # the same workload again without peers: how much one run varies
    bench throughput --preset qwen2-0.5b --name throughput_qwen2_repeat_$i | grep -A1 "^system"
done
bench latency --preset qwen2-0.5b --compare hf --name latency_qwen2 | tail -8
# issue 16's batch-1 row: the default above is auto multi-step (8 passes a plan at batch 1);
# its peer, one pass
bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 \
    --num-scheduler-steps 1 --name latency_qwen2_one_pass | tail -4
bench throughput --preset qwen2-0.5b --workload nanovllm --name nanovllm_qwen2 | grep -A4 "^system"
bench throughput --preset llama3-8b --name throughput_llama3 | grep -A4 "^system"
bench latency --preset llama3-8b --name latency_llama3 | tail -6
# per run: tok/s, efficiency, decode step wall/device, host time per phase of a 256-row step
python3 benchmarks/trace_summary.py "$out" 2>&1 | tee -a "$log"
