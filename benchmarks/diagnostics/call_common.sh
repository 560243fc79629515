# Sourced by the device-call scripts (call_s5.sh onward): sets out ($OUT, with
# r/ made for the results), exports PAGEDRT_COMMIT from the carried .commit, installs the
# carried wheels (benchmarks/use_wheels.sh), prints the GPU and its clocks, and defines
# gpu_tests NAME CAP FILES... (pytest -m gpu on FILES, capped at CAP seconds, its output in
# $out/r/NAME.txt and its summary printed) and tune NAME ARGS... (benchmarks/decode_tune.py
# compiled in 8 parallel shards, timings discarded, then timed in one process from Triton's
# cache: $out/r/tune_NAME.txt and tune_NAME/).
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
tune() {  # name, then decode_tune arguments
  local name=$1
  shift
  for i in 0 1 2 3 4 5 6 7; do
    timeout 150 python3 benchmarks/decode_tune.py --out "$out/r/shard_$name$i" --shard $i/8 "$@" \
      > /dev/null 2>&1 &
  done
  wait
  rm -rf "$out"/r/shard_"$name"*
  timeout 200 python3 benchmarks/decode_tune.py --out "$out/r/tune_$name" "$@" > "$out/r/tune_$name.txt" 2>&1
}
