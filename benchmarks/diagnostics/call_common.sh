# Sourced by the device-call scripts (call_s5.sh onward): sets out ($OUT, with
# r/ made for the results), exports PAGEDRT_COMMIT from the carried .commit, installs the
# carried wheels (benchmarks/use_wheels.sh), prints the GPU and its clocks, and defines
# gpu_tests NAME CAP FILES... (pytest -m gpu on FILES, capped at CAP seconds, its output in
# $out/r/NAME.txt and its summary printed) and tune NAME ARGS... (benchmarks/decode_tune.py
# compiled in 8 parallel shards, timings discarded, then timed in one process from Triton's
# cache: $out/r/tune_NAME.txt and tune_NAME/), and fp8_vs_bf16 NAME REQUESTS INPUT OUTPUT
# MAX_MODEL_LEN (Llama-3-8B preset, FP8 against bf16 in one `bench throughput`, KV-bound at
# gpu_memory_utilization 0.30: $out/r/NAME.txt and .json, its summary printed).
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
  local name=$1 i  # (i local: a caller looping over i keeps its value)
  shift
  for i in 0 1 2 3 4 5 6 7; do
    timeout 150 python3 benchmarks/decode_tune.py --out "$out/r/shard_$name$i" --shard $i/8 "$@" \
      > /dev/null 2>&1 &
  done
  wait
  rm -rf "$out"/r/shard_"$name"*
  timeout 200 python3 benchmarks/decode_tune.py --out "$out/r/tune_$name" "$@" > "$out/r/tune_$name.txt" 2>&1
}
fp8_vs_bf16() {  # name, requests, input, output, max model len
  timeout 300 python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset llama3-8b --kv-cache-dtype fp8 --compare-kv-cache-dtype auto --num-requests "$2" \
    --input-len "$3" --output-len "$4" --max-model-len "$5" --max-num-seqs 256 \
    --gpu-memory-utilization 0.30 --skip-step-split --warm-up-requests 4 --name "$1" \
    --out "$out/r" > "$out/r/$1.txt" 2>&1
  grep -h "^pagedrt KV\|fp8_e4m3 / bfloat16\|prefill steps\|decode steps" "$out/r/$1.txt"
}
