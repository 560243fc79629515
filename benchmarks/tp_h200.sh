#!/usr/bin/env bash
# Tensor parallelism on the single H200 (issue 15, "On the GPU now"): TP = 1 in the engine's
# process (the path of the issue-6 records) against TP = 1 through the worker-process path
# (--distributed-executor-backend mp: the model in a spawned worker, plans sent to it, tokens
# back), on the qwen2-0.5b and llama3-8b presets; then the GPU tests (tests/gpu/test_tp_gpu.py:
# the worker path gives the in-process greedy tokens with CUDA graphs replayed and async
# scheduling on; TP = 2 over NCCL is skipped on one GPU). At most 4 minutes (each step gets
# what is left; the full log is $OUT/tp_h200.log). From the
# repository root on the GPU machine:
#
#   PAGEDRT_COMMIT=<hash> bash benchmarks/tp_h200.sh      # JSON results under $OUT (or ./out)
#
# Compare the in-process rows with the issue-6 records (benchmarks/results/RUNS.md, "The first
# session's runs": qwen2-0.5b 256 x 512/128 72,077 tok/s, batch-1 decode 0.906 ms/token at ctx
# 512 and 0.990 at 4096).
set -u  # keep going past a failing step: each prints its own result
out="${OUT:-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/tp_h200.log"  # the full output of every step
end=$((SECONDS + ${BUDGET_S:-230}))  # every step gets at most what is left of the 4 minutes
run() {  # run CAP_S COMMAND...: under a time-out of CAP_S or what is left, skipped near the end
    local cap=$1; shift
    local left=$((end - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 15 ]; then echo "SKIPPED (out of time): $*" | tee -a "$log"; return; fi
    timeout "$cap" "$@" >>"$log" 2>&1 || echo "FAILED or timed out (status $?): $*" | tee -a "$log"
}
bench() { run "$1" python3 -m pagedrt.entrypoints.cli bench "${@:2}" --out "$out"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
[ "${TP_TESTS:-1}" = 1 ] && run 75 python3 -m pytest -q -m gpu tests/gpu/test_tp_gpu.py  # TP_TESTS=0: run already
grep -E "passed|failed|error" "$log" | tail -1
mp=(--distributed-executor-backend mp)
for path in inproc mp; do  # each pair in-process then worker process, most wanted first
    opt=(); [ "$path" = mp ] && opt=("${mp[@]}")
    bench 60 throughput --preset qwen2-0.5b ${opt[@]+"${opt[@]}"} --name "tp_throughput_qwen2_$path"
done
for path in inproc mp; do
    opt=(); [ "$path" = mp ] && opt=("${mp[@]}")
    bench 40 latency --preset qwen2-0.5b ${opt[@]+"${opt[@]}"} --name "tp_latency_qwen2_$path"
done
for path in inproc mp; do
    opt=(); [ "$path" = mp ] && opt=("${mp[@]}")
    bench 45 latency --preset llama3-8b --contexts 512 --num-tokens 64 ${opt[@]+"${opt[@]}"} \
        --name "tp_latency_llama3_$path"
done
for path in inproc mp; do
    opt=(); [ "$path" = mp ] && opt=("${mp[@]}")
    bench 60 throughput --preset llama3-8b --num-requests 128 --max-num-seqs 128 \
        ${opt[@]+"${opt[@]}"} --name "tp_throughput_llama3_$path"
done
python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = []
for model in ("qwen2", "llama3"):
    for path in ("inproc", "mp"):
        for kind in ("throughput", "latency"):
            f = os.path.join(out, f"tp_{kind}_{model}_{path}.json")
            if not os.path.exists(f):
                rows.append((model, path, kind, "missing", ""))
                continue
            doc = json.load(open(f))
            for r in doc["results"]:
                if kind == "throughput" and r.get("step_times"):
                    st = r["step_times"]
                    rows.append((model, path, r["workload"].split()[-1],
                                 f"{r['output_tok_s']:,.0f} tok/s",
                                 f"decode step p50 {st['decode_step_ms_median']:.2f} ms"))
                elif kind == "latency":
                    graphs = "graphs" if r.get("cuda_graphs") else "eager"
                    rows.append((model, path, f"{r['workload'].split()[-1]} {graphs}",
                                 f"{r['ms_per_token']:.3f} ms/token", ""))
print(f"\n{'model':<7} {'path':<7} {'run':<22} {'figure':>16}  note")
for m, p, run, fig, note in rows:
    print(f"{m:<7} {p:<7} {run:<22} {fig:>16}  {note}")
EOF
