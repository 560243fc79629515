#!/usr/bin/env bash
# The offline figures of an older commit and of this tree, alternated in one device call, so
# that both meet the same machine (lent H200s differ by up to ~15% from call to call on the
# same code: benchmarks/results/RUNS.md, "Why runs of one commit differ: the host"). The
# older tree is a plain copy of its pagedrt/ package (no .git), made here and carried to the
# device:
#
#   git archive baca7b5 pagedrt | tar -x -C .base       # .base is git-ignored
#   BASE=.base BASE_COMMIT=baca7b5 REPEATS=3 OUT=out bash benchmarks/paired_h200.sh
#
# Runs, alternating base / head: `bench throughput --preset qwen2-0.5b` REPEATS times each
# (in ABBA order), `bench latency --preset qwen2-0.5b` once each (unless LAT=0), the nano-vllm workload
# NANO_REPEATS times each (1; in ABBA order). One process per run. Prints a table last (medians); the JSON of
# every run is under $OUT.
set -u
. benchmarks/base_and_head.sh
log="$out/paired.log"
one() {  # one TREE COMMIT NAME ARGS...
    local tree=$1 commit=$2 name=$3; shift 3
    (cd "$tree" && PAGEDRT_COMMIT=$commit PYTHONPATH="$tree$extra" timeout "${CAP:-90}" \
        python3 -m pagedrt.entrypoints.cli bench "$@" --name "$name" --out "$out") >>"$log" 2>&1 \
        || echo "FAILED (status $?): $name" | tee -a "$log"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for i in $(seq "${REPEATS:-3}"); do  # ABBA: base, head, head, base, ...
    if [ $((i % 2)) = 1 ]; then
        one "$base" "$base_commit" "base_thr_$i" throughput --preset qwen2-0.5b
        one "$head" "$head_commit" "head_thr_$i" throughput --preset qwen2-0.5b
    else
        one "$head" "$head_commit" "head_thr_$i" throughput --preset qwen2-0.5b
        one "$base" "$base_commit" "base_thr_$i" throughput --preset qwen2-0.5b
    fi
done
for kind in $([ "${LAT:-1}" = 1 ] && echo base head); do
    tree=$head; commit=$head_commit; [ $kind = base ] && { tree=$base; commit=$base_commit; }
    one "$tree" "$commit" "${kind}_lat" latency --preset qwen2-0.5b
done
for i in $(seq "${NANO_REPEATS:-1}"); do  # ABBA: base, head, head, base, ...
    kinds="base head"; [ $((i % 2)) = 0 ] && kinds="head base"
    for kind in $kinds; do
        tree=$head; commit=$head_commit; [ $kind = base ] && { tree=$base; commit=$base_commit; }
        one "$tree" "$commit" "${kind}_nano_$i" throughput --preset qwen2-0.5b --workload nanovllm
    done
done
python3 - "$out" "$base_commit" "$head_commit" <<'PY'
import glob, json, os, statistics, sys
out, names = sys.argv[1], {"base": sys.argv[2], "head": sys.argv[3]}
def results(pattern):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, pattern + ".json"))):
        rows += json.load(open(path))["results"]
    return [r for r in rows if r.get("system") == "pagedrt"]
print(f"\n{'figure':<34} {'base ' + names['base']:>18} {'head ' + names['head']:>18} {'head/base':>9}")
def row(label, key, pattern, pick=lambda r: True, unit=""):
    vals = {}
    for kind in ("base", "head"):
        v = [r[key] for r in results(kind + pattern) if pick(r)]
        vals[kind] = v
    if not vals["base"] or not vals["head"]:
        print(f"{label:<34} missing: {vals}")
        return
    b, h = statistics.median(vals["base"]), statistics.median(vals["head"])
    fmt = lambda v: " / ".join(f"{x:,.0f}" if x > 100 else f"{x:.3f}" for x in v)
    print(f"{label:<34} {fmt(vals['base']):>18} {fmt(vals['head']):>18} {h / b:>8.3f}x")
row("qwen2 256x512/128 out tok/s", "output_tok_s", "_thr_*", lambda r: r["num_requests"] == 256)
row("batch-1 ms/token ctx 512", "ms_per_token", "_lat",
    lambda r: r.get("cuda_graphs") and r["workload"].endswith("ctx512"))
row("batch-1 ms/token ctx 4096", "ms_per_token", "_lat",
    lambda r: r.get("cuda_graphs") and r["workload"].endswith("ctx4096"))
row("nano-vllm workload out tok/s", "output_tok_s", "_nano_*")
PY
