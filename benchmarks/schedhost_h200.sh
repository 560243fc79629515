#!/usr/bin/env bash
# The steady decode path of the scheduler (docs/design.md, "Host work per step"), an older tree
# against this one, alternated in one device call (about 3.5 minutes on a warm H200):
#
#   git archive 1c196c2 pagedrt | tar -x -C .base       # .base is git-ignored: carry it
#   BASE=.base BASE_COMMIT=1c196c2 OUT=out bash benchmarks/schedhost_h200.sh
#
# 1. benchmarks/host_step_cpu.py (stub model, no GPU work: the host side only) on this
#    machine's CPU, greedy and nanovllm sampling and greedy with --churn (sequences leave and
#    join), async, base / head alternated twice; per phase the median over the steps;
# 2. Qwen2-0.5B on the nano-vllm workload (`pagedrt bench throughput --workload nanovllm`,
#    without the synchronizing second pass), base then head: output tok/s, the median decode
#    step (wall / device) and the host ms per phase of the largest-batch decode steps.
# Prints a table last; every run's JSON and log are under $OUT.
set -u
. benchmarks/base_and_head.sh
log="$out/schedhost.log"
host_step() {  # host_step TREE KIND SETTING ROUND
    local args="--sampling $3"
    [ "$3" = churn ] && args="--sampling greedy --churn"
    PYTHONPATH="$1$extra" timeout 40 python3 "$head/benchmarks/host_step_cpu.py" --async \
        $args --steps 120 --json "$out/host_${2}_${3}_$4.json" >>"$log" 2>&1 \
        || echo "FAILED (status $?): host_step $2 $3 $4" | tee -a "$log"
}
nano() {  # nano TREE COMMIT KIND
    (cd "$1" && PAGEDRT_COMMIT=$2 PYTHONPATH="$1$extra" timeout 100 python3 -m \
        pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b --workload nanovllm \
        --skip-step-split --name "nano_$3" --out "$out") >>"$log" 2>&1 \
        || echo "FAILED (status $?): nano $3" | tee -a "$log"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for round in 1 2; do
    for s in greedy nanovllm churn; do
        host_step "$base" base "$s" "$round"
        host_step "$head" head "$s" "$round"
    done
done
nano "$base" "$base_commit" base
nano "$head" "$head_commit" head
python3 - "$out" "$base_commit" "$head_commit" <<'PY'
import glob, json, os, statistics, sys
out, base_commit, head_commit = sys.argv[1:4]
print(f"\nhost_step_cpu.py, 256 rows, async: ms per step (medians over steps, then over the two"
      f" rounds), base {base_commit} / head {head_commit}")
print(f"{'setting':<10} {'phase':<9} {'base':>8} {'head':>8} {'head/base':>9}")
for s in ("greedy", "nanovllm", "churn"):
    runs = {}
    for kind in ("base", "head"):
        runs[kind] = [json.load(open(p))["results"][0]
                      for p in sorted(glob.glob(os.path.join(out, f"host_{kind}_{s}_*.json")))]
    if not runs["base"] or not runs["head"]:
        print(f"{s:<10} missing")
        continue
    phases = ["median_ms", "cpu_ms"] + list(runs["head"][0]["phases_median_ms"])
    for ph in phases:
        get = ((lambda r: r[ph]) if ph.endswith("_ms")
               else (lambda r: r["phases_median_ms"].get(ph, 0)))
        b = statistics.median(get(r) for r in runs["base"])
        h = statistics.median(get(r) for r in runs["head"])
        print(f"{s:<10} {ph:<9} {b:>8.3f} {h:>8.3f} {h / b if b else float('nan'):>8.2f}x")
print("\nQwen2-0.5B, nano-vllm workload (one run each):")
for kind in ("base", "head"):
    path = os.path.join(out, f"nano_{kind}.json")
    if not os.path.exists(path):
        print(f"{kind}: missing")
        continue
    for r in json.load(open(path))["results"]:
        if r.get("system") != "pagedrt":
            continue
        trace = [row for row in r["step_trace"] if len(row) >= 5]
        top = max(row[1] for row in trace)
        dec = [row for row in trace if row[1] == top and row[2] == top]
        host = {ph: statistics.median(row[4][ph] for row in dec) for ph in dec[0][4]} if dec else {}
        st = r["step_times"]
        print(f"{kind}: {r['output_tok_s']:,.0f} tok/s; decode step median "
              f"{st['decode_step_ms_median']:.2f} wall / "
              f"{st['decode_model_device_ms_median'] or float('nan'):.2f} device ms; host per "
              f"{top}-row decode step {sum(host.values()):.2f} ms ("
              + " ".join(f"{k} {v:.2f}" for k, v in host.items()) + ")")
PY
