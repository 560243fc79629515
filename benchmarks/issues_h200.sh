#!/usr/bin/env bash
# The GPU part of several issues in one device call: every test under tests/gpu, then each
# issue's own script (benchmarks/<name>_h200.sh: tp, fp8kv, window, spec, beam), each under a
# time cap, its output under $OUT/<name>/. From the repository root on the GPU machine, with the
# wheels in .whl/ and the SmolLM2 GGUF at $SMOLLM2_GGUF (benchmarks/README.md, "Running on the
# lent H200"):
#
#   PAGEDRT_COMMIT=<hash> SCRIPTS="tp:150 fp8kv" bash benchmarks/issues_h200.sh   # NAME:CAP_S
#
# Each script's last lines (its table) are printed; everything is packed into results.tgz
# ($OUT brings back at most 8 files).
set -u
out="${OUT:-out}"
mkdir -p "$out"
. benchmarks/use_wheels.sh
export SMOLLM2_GGUF="${SMOLLM2_GGUF:-/tmp/smollm2.gguf}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "${GPU_TESTS:-1}" = 1 ]; then
  timeout "${TEST_CAP:-180}" python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
    > "$out/gpu_tests.txt" 2>&1
  echo "== pytest -m gpu tests/gpu (status $?)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/gpu_tests.txt" | tail -12
fi
for item in ${SCRIPTS:-tp fp8kv window spec beam}; do  # NAME or NAME:CAP_SECONDS
  name=${item%%:*}; cap=${CAP:-250}; [ "$item" != "$name" ] && cap=${item#*:}
  mkdir -p "$out/$name"
  OUT="$out/$name" BUDGET_S=$((cap - 12)) timeout "$cap" bash "benchmarks/${name}_h200.sh" \
    > "$out/$name/stdout.txt" 2>&1
  echo "== $name (status $?)"
  grep -v -i "warn" "$out/$name/stdout.txt" | tail -"${TAIL:-20}"
done
tar -czf /tmp/results.tgz -C "$out" . 2>/dev/null && mv /tmp/results.tgz "$out/results.tgz" \
  && find "$out" -mindepth 1 -maxdepth 1 ! -name results.tgz -exec rm -rf {} +
