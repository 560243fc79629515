#!/usr/bin/env bash
# 2026-12-04 00:10 UTC (carry .commit and .whl; ~5 min). Issue 16's decode matmul with the
# tuned CONFIGS: its GPU tests, which shapes the engine's start-up timing hands to it
# (Qwen2-0.5B preset, 256 sequences), then PAGEDRT_MATMUL=0 against the default in one call:
# Qwen2-0.5B 256 x 512/128 with batches 8, 32, 64 (off, on), the nano-vllm workload (on, off).
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests matmul 150 tests/gpu/test_matmul_gpu.py
timeout 90 python3 - > "$out/r/choices.txt" 2>&1 <<'PY'
import torch
from pagedrt import LLM
from pagedrt.bench.presets import get_preset, random_model
from pagedrt.ops import matmul_triton as m
model = random_model(get_preset("qwen2-0.5b"), torch.bfloat16, torch.device("cuda"))
llm = LLM(model, max_num_seqs=256, max_model_len=4096, gpu_memory_utilization=0.5)
for k, v in sorted(m._CHOICE.items(), key=str):
    print(k[0], tuple(k[1]), "rows", k[2], "bias", k[4], "->", v)
PY
echo "choices status $?"; grep -c -- "-> (" "$out/r/choices.txt"; grep -c -- "-> None" "$out/r/choices.txt"
thr() {  # name, MATMUL, extra args
  PAGEDRT_MATMUL=$2 timeout 100 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --name "$1" --out "$out/r" "${@:3}" > "$out/r/$1.txt" 2>&1
  echo "$1 status $?"
}
thr off_thr 0 --batch-sizes 8,32,64
thr on_thr 1 --batch-sizes 8,32,64
thr on_nano 1 --workload nanovllm
thr off_nano 0 --workload nanovllm
python3 benchmarks/trace_summary.py "$out"/r/*_thr.json "$out"/r/*_nano.json 2>&1 | cut -c1-160
python3 - "$out/r" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_thr.json")) + glob.glob(os.path.join(sys.argv[1], "*_nano.json"))):
    rs = [r for r in json.load(open(f))["results"] if r.get("system") == "pagedrt"]
    print(os.path.basename(f), " ".join(f"{r['num_requests']}:{r['output_tok_s']:,.0f}" for r in rs))
PY
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
