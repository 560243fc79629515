#!/usr/bin/env bash
# prefill_parts.py (extend configs at 32 x 512, 16 x 1,024 and 4 x 4,096 tokens of Qwen2-0.5B's
# heads; gate/up with SwiGLU's activation in matmul_triton's epilogue at 16,384 and 4,096 rows;
# the MLP whole and chunked), then the fastest of each end to end: Qwen2-0.5B 256 x 512/128
# with PAGEDRT_EXTEND_CONFIG (the config with the least time summed over the three shapes)
# and PAGEDRT_PREFILL_SILU_MUL (the fastest fused config at 16,384 rows, only if it beats
# cuBLAS + the activation kernel) off / on / on / off, one process each; then their GPU tests.
# (Ran 2026-12-06 at de54bc2; PAGEDRT_PREFILL_SILU_MUL lost there and was removed after.)
# Carry .commit, .whl, .tcache; ~6 min. Summaries last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
prefill_parts pp 80 100
picks=$(python3 - "$out/r/pp/prefill_parts.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
shapes = [k for k in d["extend"] if k.startswith("qwen2")]
common = set.intersection(*({c for c, v in d["extend"][s]["configs"].items() if "ms" in v}
                            for s in shapes)) - {"default"}
ext = min(common, key=lambda c: sum(d["extend"][s]["configs"][c]["ms"] for s in shapes))
default = sum(d["extend"][s]["configs"]["default"]["ms"] for s in shapes)
silu = d["silu"]["16384"]
ok = {c: v["ms"] for c, v in silu["configs"].items() if "ms" in v}
best = min(ok, key=ok.get) if ok else None
s = best.replace("/", ",") if best and ok[best] < silu["plain_ms"] else ""
print(f"PAGEDRT_EXTEND_CONFIG={ext.replace('/', ',')} PAGEDRT_PREFILL_SILU_MUL={s}")
print(f"# extend {ext}: {sum(d['extend'][s]['configs'][ext]['ms'] for s in shapes):.3f} ms "
      f"summed against the default's {default:.3f}; silu {best}: "
      f"{ok.get(best, float('nan')):.3f} against {silu['plain_ms']:.3f} ms", file=sys.stderr)
PY
)
echo "== picks: $picks"
run() {  # name, environment
  local t0=$SECONDS
  env $2 timeout 90 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
    --skip-step-split --repeats 2 --name "$1" --out "$out/r" > "$out/r/$1.txt" 2>&1
  echo "$1 status $? in $((SECONDS - t0))s: $(grep -h "output tok/s of each\|prefill steps" \
    "$out/r/$1.txt" | tr -s ' ' | cut -c1-110 | tr '\n' ' ')"
}
run ab_off_1 "PAGEDRT_X=0"
run ab_on_1 "$picks"
run ab_on_2 "$picks"
run ab_off_2 "PAGEDRT_X=0"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -k "override" \
  tests/gpu/test_matmul_gpu.py tests/gpu/test_extend_decode_rows_gpu.py > "$out/r/gpu_tests.txt" 2>&1
echo "== override GPU tests (status $?): $(tail -1 "$out/r/gpu_tests.txt")"
grep -E "^(FAILED|ERROR)" "$out/r/gpu_tests.txt" | head -5 | cut -c1-200
grep -v "^ *$" "$out/r/pp.txt" | tail -40 | cut -c1-180
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
