#!/usr/bin/env bash
# 2026-12-04 04:05 UTC (carry .commit and .whl; ~9 min). Issue 16: the decode matmul with
# split-K configs, 8-128 rows. Which shapes the start-up timing hands to it (Qwen2-0.5B preset,
# 256 sequences), then PAGEDRT_MATMUL=0 against the default in one call: Qwen2-0.5B 512/128 at
# batches 256, 8, 32, 64, 128 (off, on, on, off) and the nano-vllm workload (on, off), the GPU
# test last.
set -u
. benchmarks/diagnostics/call_common.sh
start=$SECONDS
timeout 100 python3 - > "$out/r/choices.txt" 2>&1 <<'PY'
import time, torch
from pagedrt import LLM
from pagedrt.bench.presets import get_preset, random_model
from pagedrt.ops import matmul_triton as m
model = random_model(get_preset("qwen2-0.5b"), torch.bfloat16, torch.device("cuda"))
t = time.perf_counter()
llm = LLM(model, max_num_seqs=256, max_model_len=4096, gpu_memory_utilization=0.5)
print(f"engine built in {time.perf_counter() - t:.1f} s")
for k, v in sorted(m._CHOICE.items(), key=str):
    print(k[0], tuple(k[1]), "rows", k[2], "bias", k[4], "->", v)
PY
echo "choices status $?"; head -1 "$out/r/choices.txt"; grep -c -- "-> (" "$out/r/choices.txt"
thr() {  # name, MATMUL, extra args
  PAGEDRT_MATMUL=$2 timeout 110 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --name "$1" --out "$out/r" "${@:3}" > "$out/r/$1.txt" 2>&1
  echo "$1 status $? at $((SECONDS - start)) s"
}
thr off1_thr 0 --batch-sizes 8,32,64,128
thr on1_thr 1 --batch-sizes 8,32,64,128
thr on1_nano 1 --workload nanovllm
thr off1_nano 0 --workload nanovllm
if [ $((SECONDS - start)) -lt 300 ]; then
  thr on2_thr 1 --batch-sizes 8,32,64,128
  thr off2_thr 0 --batch-sizes 8,32,64,128
fi
python3 - "$out/r" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_thr.json")) + glob.glob(os.path.join(sys.argv[1], "*_nano.json"))):
    rs = [r for r in json.load(open(f))["results"] if r.get("system") == "pagedrt"]
    print(os.path.basename(f), " ".join(f"{r['num_requests']}:{r['output_tok_s']:,.0f}:{100 * r.get('roofline_efficiency', 0):.1f}%" for r in rs))
PY
if [ $((SECONDS - start)) -lt 480 ]; then gpu_tests matmul 80 tests/gpu/test_matmul_gpu.py; fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
