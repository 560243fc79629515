# Sourced by the device-call scripts (call_s5.sh onward): sets out ($OUT, with
# r/ made for the results), restores a carried Triton cache (.tcache/) and defines
# save_triton_cache, exports PAGEDRT_COMMIT from the carried .commit, installs the
# carried wheels (benchmarks/use_wheels.sh), prints the GPU and its clocks, and defines
# bench_env NAME CAP ENV ARGS... / status_bench NAME CAP ARGS... / latency_env NAME CAP ENV
# ARGS... (one Qwen2-0.5B `bench throughput` or `bench latency` process with ENV, its summary
# printed; status_bench also the run's details and the GPU's clocks), and
# gpu_tests NAME CAP FILES... (pytest -m gpu on FILES, capped at CAP seconds, its output in
# $out/r/NAME.txt and its summary printed) and tune NAME ARGS... (benchmarks/decode_tune.py
# compiled in 8 parallel shards, timings discarded, then timed in one process from Triton's
# cache: $out/r/tune_NAME.txt and tune_NAME/), and fp8_vs_bf16 NAME REQUESTS INPUT OUTPUT
# MAX_MODEL_LEN (Llama-3-8B preset, FP8 against bf16 in one `bench throughput`, KV-bound at
# gpu_memory_utilization 0.30: $out/r/NAME.txt and .json, its summary printed), and
# switch_runs KIND VAR NAME:VALUE... (one process per NAME:VALUE with VAR=VALUE in its
# environment, in the order given: KIND latency = Qwen2-0.5B batch-1 ms/token at ctx 512 and
# 4,096, KIND throughput = Qwen2-0.5B 512/128 at batches 8-128; $out/r/<kind>_NAME.txt and
# .json, one summary line each), and latency_run NAME CAP [ENV] (Qwen2-0.5B batch-1 ms/token
# at ctx 512 and 4,096 with ENV, capped at CAP seconds: $out/r/lat_NAME.txt and .json, a
# summary line and the run's 1-row tile choices printed, with the in-step timing's findings
# where PAGEDRT_STEP_TIMING is set), and lat_tree TREE NAME CAP (one such process of this tree,
# or with TREE base of .base/, whose commit BASE_COMMIT names), and sweep NAME [ENV] (the batch sweep of record, Qwen2-0.5B
# 512/128 at 256 and batches 8-128 with --repeats 3 and ENV, capped at 200 s: $out/r/sweep_NAME
# .txt and .json, a summary line), and timeline_run BATCH STEPS CAP [ENV [SUFFIX]]
# (decode_timeline.py at ctx 512 with ENV: $out/r/tl_bBATCH[SUFFIX].txt and .json, its totals
# and attention kernels printed), and
# gpu_tests_sharded NAME CAP SHARDS PATHS... (the GPU tests of PATHS in SHARDS pytest processes
# at once, each capped at CAP seconds: $out/r/NAME_sK.txt, per shard its summary printed), and
# prefill_parts NAME SHARD_CAP CAP (benchmarks/diagnostics/prefill_parts.py compiled in 8
# shards, then timed in one process: $out/r/NAME.txt and NAME/prefill_parts.json), and
# warm_cache CAP CMD... (CMD in 8 cache-warming processes at once, PAGEDRT_WARM_SHARD=i/8),
# warm_qwen2_cache CAP (warm_cache over a small Qwen2-0.5B workload), and clocks_start NAME /
# clocks_stop NAME (the GPU's SM clock, power and temperature sampled
# in between: $out/r/clocks_NAME.csv, a summary line), and burst_summary JSON... (each pagedrt
# row's multi-step setting and its bursts).
out="${OUT:-out}"; mkdir -p "$out/r"
# A fresh machine spends minutes compiling Triton kernels (call_s82: the first two engines and
# a GPU test file ran out of their caps compiling). A call that ends with save_triton_cache
# returns the cache in 15 MB parts ($OUT/tc.txz.NN, xz: the 296 MB cache of 2026-12-05 is
# 13 MB there, 45 MB as gzip, which no longer fitted beside the ~38 MB tree in a call's 64 MiB);
# put them in .tcache/ here (.git/info/exclude it) and carry .tcache: the next call starts from
# that cache. Older gzip parts (tc.tgz.NN) are still read.
tcache="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
if ls .tcache/tc.txz.* > /dev/null 2>&1 && command -v xz > /dev/null; then
  mkdir -p "$tcache" && cat .tcache/tc.txz.* | tar -xJf - -C "$tcache" \
    && echo "triton cache restored: $(ls "$tcache" | wc -l) entries"
elif ls .tcache/tc.tgz.* > /dev/null 2>&1; then
  mkdir -p "$tcache" && cat .tcache/tc.tgz.* | tar -xzf - -C "$tcache" \
    && echo "triton cache restored: $(ls "$tcache" | wc -l) entries"
fi
save_triton_cache() {  # the Triton cache into $OUT/tc.txz.NN (tc.tgz.NN without xz), 15 MB each
  local ext=txz pack="xz -T0 -9"
  command -v xz > /dev/null || { ext=tgz; pack="gzip"; }
  tar -cf - -C "$tcache" . | $pack > /tmp/tc.$ext && split -b 15m -d /tmp/tc.$ext "$out/tc.$ext." \
    && echo "triton cache saved: $(du -sh /tmp/tc.$ext | cut -f1) in $(ls "$out"/tc.$ext.* | wc -l) parts"
}
export PAGEDRT_COMMIT="$(cat .commit 2>/dev/null || echo head)"
# the start-up timing's choices kept on disk (pagedrt/ops/config_cache.py) inside Triton's
# cache, so save_triton_cache carries them too: a later process of the same commit and
# settings takes them instead of timing again (the tests set it off and time for themselves,
# tests/conftest.py)
export PAGEDRT_CONFIG_CACHE="${PAGEDRT_CONFIG_CACHE:-$tcache/pagedrt-configs}"
. benchmarks/use_wheels.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
cut_note() {  # status, pytest log: where a run its cap cut (timeout's 124, or 137 after the
  # kill) was, from its KeyboardInterrupt traceback and, with -v, the last test it started
  if [ "$1" = 124 ] || [ "$1" = 137 ]; then
    echo "   cut by the cap in: $(grep -E "^tests/gpu/.*::" "$2" | tail -1 | cut -c1-120)" \
      "(traceback ends in: $(grep -E '^  File ' "$2" | tail -1 | cut -c1-120))"
  fi
}
gpu_tests() {  # name, cap, test files...
  local name=$1 cap=$2
  shift 2
  # SIGINT at the cap: pytest then prints where it was (as gpu_tests_sharded)
  timeout -s INT -k 15 "$cap" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" \
    > "$out/r/$name.txt" 2>&1
  local status=$?
  echo "== $name (status $status)"
  grep -E "^(FAILED|ERROR)|passed|failed| in [0-9.]+s" "$out/r/$name.txt" | tail -8
  cut_note "$status" "$out/r/$name.txt"
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
switch_runs() {  # kind (latency|throughput), environment variable, name:value...
  local kind=$1 var=$2 n name v
  shift 2
  for n in "$@"; do
    IFS=: read -r name v <<< "$n"
    if [ "$kind" = latency ]; then
      env "$var=$v" timeout 90 python3 -m pagedrt.entrypoints.cli bench latency \
        --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3 \
        --name "latency_$name" --out "$out/r" > "$out/r/latency_$name.txt" 2>&1
      echo "latency_$name ($var=$v) status $?: $(grep -E "batch1" "$out/r/latency_$name.txt" \
        | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
    else
      env "$var=$v" timeout 150 python3 -m pagedrt.entrypoints.cli bench throughput \
        --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 \
        --name "throughput_$name" --out "$out/r" > "$out/r/throughput_$name.txt" 2>&1
      echo "throughput_$name ($var=$v) status $?: $(grep -E "^pagedrt +qwen" \
        "$out/r/throughput_$name.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
    fi
  done
}
latency_run() {  # name, cap, extra environment (VAR=VALUE or "")
  latency_env "lat_$1" "$2" "${3:-}"
  python3 - "$out/r/lat_$1.json" <<'PY' 2>/dev/null
import json, sys
for name, table in json.load(open(sys.argv[1])).get("kernel_choices", {}).items():
    for k, v in table.items():
        if ", 1, " not in k:
            continue
        if name == "step_timing":  # PAGEDRT_STEP_TIMING: alone -> kept, ms per step
            print("    step", k[:60], v["alone"], "->", v["kept"], v["step_ms"])
        else:
            print("   ", k[:72], "->", v)
PY
}
bench_env() {  # name, cap, environment (VAR=VALUE, or "" for none), then `bench throughput`
  # arguments: Qwen2-0.5B with --skip-step-split, $out/r/NAME.txt and .json, a summary line
  local name=$1 cap=$2 envs=$3 t0=$SECONDS
  shift 3
  env $envs timeout "$cap" python3 -m pagedrt.entrypoints.cli bench throughput \
    --preset qwen2-0.5b --skip-step-split --name "$name" --out "$out/r" "$@" \
    > "$out/r/$name.txt" 2>&1
  echo "$name ($envs) status $? in $((SECONDS - t0))s: $(grep -E "^pagedrt +qwen" \
    "$out/r/$name.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
status_bench() {  # name, cap, then `bench throughput` arguments: bench_env without an
  # environment, with the run's per-run figures, decode steps and start-up printed and the
  # GPU's clocks sampled through it (the status rows of call_s112.sh and call_s122.sh)
  local name=$1 cap=$2
  shift 2
  clocks_start "$name"
  bench_env "$name" "$cap" "" "$@"
  grep -h "tok/s of each\|decode steps\|start-up" "$out/r/$name.txt" | cut -c1-150
  clocks_stop "$name"
}
latency_env() {  # name, cap, environment (VAR=VALUE, or "" for none), then extra `bench
  # latency` arguments: Qwen2-0.5B batch-1 ms/token at ctx 512 and 4,096, a summary line
  local name=$1 cap=$2 envs=$3 t0=$SECONDS
  shift 3
  env $envs timeout "$cap" python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b \
    --contexts 512,4096 --graphs on --repeats 3 --name "$name" --out "$out/r" "$@" \
    > "$out/r/$name.txt" 2>&1
  echo "$name ($envs $*) status $? in $((SECONDS - t0))s: $(grep -E "batch1" \
    "$out/r/$name.txt" | tr -s ' ' | cut -d' ' -f4,6 | tr '\n' ' ')"
}
lat_tree() {  # tree (base|head), name, cap: one Qwen2-0.5B batch-1 `bench latency` process
  # (ctx 512 and 4,096) of this tree or of .base/ (its commit in BASE_COMMIT), a summary line
  # and the process's 1-row choices ($out/r/NAME.txt and .json)
  local path=$PWD commit=$PAGEDRT_COMMIT t0=$SECONDS
  [ "$1" = base ] && path=$PWD/.base commit=${BASE_COMMIT:-base}
  (cd "$path" && PAGEDRT_COMMIT=$commit PYTHONPATH="$path" timeout "$3" python3 -m \
    pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b --contexts 512,4096 \
    --graphs on --repeats 3 --name "$2" --out "$out/r") > "$out/r/$2.txt" 2>&1
  echo "$2 status $? in $((SECONDS - t0))s: $(grep -E "batch1" "$out/r/$2.txt" \
    | tr -s " " | cut -d" " -f4,6 | tr "\n" " ")"
  python3 - "$out/r/$2.json" <<'PY' 2>/dev/null
import json, sys
for name, table in json.load(open(sys.argv[1])).get("kernel_choices", {}).items():
    for k, v in table.items():
        if ", 1, " in k:
            print("   ", k[:64], "->", v)
PY
}
sweep() {  # name, extra environment (VAR=VALUE or "")
  bench_env "sweep_$1" 200 "${2:-}" --batch-sizes 8,32,64,128 --repeats 3
}
timeline_run() {  # batch, decode steps, cap[, environment (VAR=VALUE or ""), name suffix]
  local name="tl_b$1${5:-}"
  env ${4:-} timeout "$3" python3 benchmarks/diagnostics/decode_timeline.py --batch "$1" \
    --context 512 --steps "$2" --out "$out/r/$name.json" > "$out/r/$name.txt" 2>&1
  echo "$name ${4:-} status $? at ${SECONDS}s"
  grep -E "^batch|^total|^wall|_decode" "$out/r/$name.txt" | head -6
}
gpu_tests_sharded() {  # name, cap (s), shards, test paths...: `pytest -m gpu` over the paths'
  # test files in SHARDS processes at once (Triton compiles on the host's cores while the GPU
  # is shared; the engine tests size their caches by num_kv_blocks), files dealt to the
  # shard with the least weight so far (tests, plus 30 per engine the file builds), heaviest
  # file first; $out/r/NAME_sK.txt per shard, then each shard's status, failures and summary
  # (or where its cap cut it)
  local name=$1 cap=$2 shards=$3 k
  shift 3
  python3 -m pytest -q -m gpu -p no:cacheprovider --collect-only "$@" 2>/dev/null \
    | grep "::" | cut -d: -f1 | sort | uniq -c | sort -rn > "$out/r/${name}_files.txt"
  python3 - "$out/r/${name}_files.txt" "$shards" "$out/r/$name" <<'PY'
import sys
path, shards, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load, files = [0] * shards, [[] for _ in range(shards)]
# a file's weight: its tests, plus 30 for each engine it builds ("LLM(" in its source), which
# compile and time their kernels at start-up for minutes on a fresh machine (2026-12-05 19:18:
# the shards holding the spec-decode, tp and in-step-timing engines ran out of their caps while
# the one with 53 kernel tests finished in 16 s)
weighted = []
for line in open(path):
    count, name = line.split()
    engines = open(name).read().count("LLM(")
    weighted.append((int(count) + 30 * engines, name))
for weight, name in sorted(weighted, reverse=True):
    k = load.index(min(load))
    load[k] += weight
    files[k].append(name)
for k in range(shards):
    open(f"{prefix}_s{k}.files", "w").write(" ".join(files[k]))
PY
  for k in $(seq 0 $((shards - 1))); do
    # shellcheck disable=SC2046
    # -v names each test as it starts, so a cut log ends with the one running; SIGINT at the
    # cap (then SIGKILL 15 s on) makes pytest print where it was and its slowest tests
    (timeout -s INT -k 15 "$cap" python3 -m pytest -v -m gpu -p no:cacheprovider -rfE \
      --durations=12 $(cat "$out/r/${name}_s$k.files") > "$out/r/${name}_s$k.txt" 2>&1
     echo "$?" > "$out/r/${name}_s$k.status") &
  done
  wait
  for k in $(seq 0 $((shards - 1))); do
    local status
    status=$(cat "$out/r/${name}_s$k.status")
    echo "== ${name}_s$k (status $status): $(cat "$out/r/${name}_s$k.files")"
    grep -E "^(FAILED|ERROR)| in [0-9.]+s" "$out/r/${name}_s$k.txt" | tail -8 | cut -c1-200
    cut_note "$status" "$out/r/${name}_s$k.txt"
    grep -E "^tests/gpu/.*::.* (PASSED|FAILED|ERROR|SKIPPED)" "$out/r/${name}_s$k.txt" \
      | awk '{print $2}' | sort | uniq -c | tr '\n' ' '; echo
  done
}
prefill_parts() {  # name, cap of each compiling shard (s), cap of the timed run (s)
  local name=$1 i
  for i in 0 1 2 3 4 5 6 7; do
    timeout "$2" python3 benchmarks/diagnostics/prefill_parts.py --out "$out/r/${name}_shard" \
      --shard $i/8 > "$out/r/${name}_shard$i.txt" 2>&1 &
  done
  wait
  timeout "$3" python3 -u benchmarks/diagnostics/prefill_parts.py --out "$out/r/$name" \
    > "$out/r/$name.txt" 2>&1
  echo "== $name (status $?) at ${SECONDS}s"
}
warm_qwen2_cache() {  # cap (s): warm_cache over a small Qwen2-0.5B throughput workload, the
  # kernels of the status runs (call_s110.sh, call_s111.sh)
  warm_cache "$1" python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
    --num-requests 16 --input-len 512 --output-len 16 --kv-cache-memory-bytes 4000000000 \
    --skip-step-split --out /tmp/warm_out
}
clocks_start() {  # name: the GPU's SM clock, power and temperature every 250 ms into
  # $out/r/clocks_NAME.csv until clocks_stop (compute-bound prefill steps have run 25-36 ms
  # in processes of one call; the clock says whether the GPU slowed)
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits \
    -lms 250 > "$out/r/clocks_$1.csv" 2>/dev/null &
  echo $! > "/tmp/clocks_$1.pid"
}
clocks_stop() {  # name: stop its sampling, print SM MHz min / median / max, W max, C max
  kill "$(cat "/tmp/clocks_$1.pid")" 2>/dev/null
  python3 - "$out/r/clocks_$1.csv" <<'PY'
import statistics, sys
rows = [[float(v) for v in line.split(",")] for line in open(sys.argv[1]) if line.strip()
        and "N/A" not in line]
if rows:
    sm = [r[0] for r in rows]
    print(f"   clocks: SM {min(sm):.0f} / {statistics.median(sm):.0f} / {max(sm):.0f} MHz,"
          f" {max(r[1] for r in rows):.0f} W max, {max(r[2] for r in rows):.0f} C max,"
          f" {len(rows)} samples")
PY
}
warm_cache() {  # cap (s), then a command: the command in 8 processes at once with
  # PAGEDRT_WARM_SHARD=0/8 ... 7/8 (each compiles an eighth of every timed choice's configs,
  # times none; pagedrt/ops/config_timing.py, `_warm_only`), output discarded, each capped;
  # so the real run after it finds its kernels in Triton's cache. Give the command a small
  # workload and a fixed KV size (--kv-cache-memory-bytes: eight engines share the GPU, and
  # --gpu-memory-utilization counts the others' memory as used).
  local cap=$1 i t0=$SECONDS
  shift
  for i in 0 1 2 3 4 5 6 7; do
    PAGEDRT_WARM_SHARD=$i/8 timeout "$cap" "$@" > "$out/r/warm_$i.txt" 2>&1 &
  done
  wait
  echo "== warm_cache: $((SECONDS - t0)) s, $(ls "$tcache" 2>/dev/null | wc -l) cache entries"
}
burst_summary() {  # bench JSON files...: per pagedrt row its workload, output tok/s, passes
  # setting, cap and how many plans of several passes (bursts) it ran (call_s159, call_s160)
  python3 - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    for r in json.load(open(path)).get("results", []):
        if r.get("system") == "pagedrt":
            print(path.rsplit("/", 1)[-1], r["workload"], round(r["output_tok_s"]),
                  "steps", r.get("num_scheduler_steps"), "cap", r.get("multi_step_max_num_seqs"),
                  "bursts", r.get("num_multi_step_plans"))
PY
}
