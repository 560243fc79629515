# Sourced by the device-call scripts (call_s5.sh to call_s8.sh): sets out ($OUT, with
# r/ made for the results), exports PAGEDRT_COMMIT from the carried .commit, installs the
# carried wheels (benchmarks/use_wheels.sh), prints the GPU and its clocks, and defines
# gpu_tests NAME CAP FILES... (pytest -m gpu on FILES, capped at CAP seconds, its output in
# $out/r/NAME.txt and its summary printed).
out="${OUT:-out}"; mkdir -p "$out/r"
export PAGEDRT_COMMIT="$(cat .commit 2>/dev/null || echo head)"
. benchmarks/use_wheels.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
gpu_tests() {  # name, cap, test files...
  local name=$1 cap=$2
  shift 2
  timeout "$cap" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" > "$out/r/$name.txt" 2>&1
  echo "== $name (status $?)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/r/$name.txt" | tail -8
}
