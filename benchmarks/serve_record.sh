#!/usr/bin/env bash
# Issue-13 figures in one device call: offline `LLM.generate` and `pagedrt serve` on the same
# random-weight folder, measured back to back, plus the offline figures of record. Run from the
# repository root on the GPU machine, with the server's wheels in .whl/, SmolLM2's tokenizer
# folder in .tok/ and (for the guidellm cross-check) guidellm's wheels in .whl-guidellm/
# (benchmarks/README.md, "Running on the lent H200"):
#
#   PAGEDRT_COMMIT=<hash> bash benchmarks/serve_record.sh      # results in $OUT (or ./out)
#
# The served model: Qwen2-0.5B's shape with SmolLM2's 49,152-token vocabulary (every generated
# token then has text, so a streamed chunk follows every token; the preset's 151,936 ids would
# leave two thirds of the tokens without text in SmolLM2's tokenizer).
# Steps: GPU smoke check; offline Qwen2-0.5B preset 256 x 512/128, batch-1 latency and the
# nano-vllm workload (the figures of record); offline 256 x 512/128 and 256 x 128/512 on the
# served folder; then the server (API_SERVERS: the default count when empty): a burst of 256
# streams of each workload, the first with twice the client processes, both not streamed, a
# lone request (new prompt, then the same prompt again: a prefix-cache hit), a request-rate
# sweep, and guidellm on the first workload. A summary table is printed last. The engine core
# writes its step timeline ($PAGEDRT_STEP_TRACE), summarized by
# benchmarks/diagnostics/step_trace.py.
set -u
out="${OUT:-out}"
mkdir -p "$out"
log="$out/serve_record.log"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
model=/tmp/qwen2-0.5b-v49152-random
clients="${CLIENTS:-4}"
engine_opts="--max-num-batched-tokens 16384 --max-model-len 4096 --gpu-memory-utilization 0.85"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$log"
[ -d "$model" ] || python3 benchmarks/make_random_folder.py --preset qwen2-0.5b --vocab-size 49152 \
  --tokenizer .tok --out "$model" 2>&1 | grep -v shards | tee -a "$log"

if [ "${SKIP_OFFLINE:-0}" != 1 ]; then
  [ "${SKIP_SMOKE:-0}" = 1 ] || timeout 200 python3 benchmarks/gpu_engine_check.py --smoke --out "$out" 2>&1 | tee -a "$log" \
    | grep -E "PASS|FAIL|passed"
  if [ "${RECORD_OFFLINE:-1}" = 1 ]; then
  timeout 300 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b --name preset_512_128 --out "$out" \
    >> "$log" 2>&1
  grep -h -A1 "^system" "$log" | tail -1
  timeout 300 python3 -m pagedrt.entrypoints.cli bench latency --preset qwen2-0.5b --name latency_qwen2 --out "$out" 2>&1 \
    | tee -a "$log" | tail -4
  timeout 300 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b --workload nanovllm --name nanovllm_qwen2 \
    --out "$out" >> "$log" 2>&1
  grep -h -A1 "^system" "$log" | tail -1
  fi
  # 256 requests at once (the bursts) and 1,024 with 256 running at a time (the sustained runs)
  for w in "256 512 128" "256 128 512" "1024 512 128" "1024 128 512"; do
    set -- $w
    name="offline_${2}_${3}"; [ "$1" = 256 ] || name="offline_${1}x_${2}_${3}"
    timeout 300 python3 -m pagedrt.entrypoints.cli bench throughput --model "$model" --num-requests "$1" \
      --input-len "$2" --output-len "$3" --name "$name" --out "$out" >> "$log" 2>&1
    grep -h -A1 "^system" "$log" | tail -1
  done
fi

for n in ${API_SERVERS:-default}; do
  [ "${SKIP_SERVE:-0}" = 1 ] && break
  port=8000
  url="http://127.0.0.1:$port"
  count=""
  [ "$n" = default ] || count="--api-server-count $n"
  PAGEDRT_STEP_TRACE="$out/step_trace_api$n.json" \
  python3 -m pagedrt.entrypoints.cli serve --model "$model" --port "$port" $count $engine_opts \
    > "$out/serve_api$n.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    grep -q "pagedrt: serving" "$out/serve_api$n.log" && curl -sf "$url/health" > /dev/null && break
    sleep 0.5
  done
  head -3 "$out/serve_api$n.log"
  # CPU seconds of the engine core and of all API processes over each run (from /proc), to see
  # which process is busy: the pids come from the server's "ready" line
  pids=$(grep -o "engine core pid [0-9]*, API pids [0-9,]*" "$out/serve_api$n.log")
  core_pid=$(echo "$pids" | awk '{print $4}' | tr -d ,)
  api_pids=$(echo "$pids" | awk '{print $7}' | tr , ' ')
  ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
  hz=$(getconf CLK_TCK)
  bs() {  # name, then bench-serve options
    local name=$1; shift
    local c0 a0 w0 c1 a1 w1
    c0=$(ticks $core_pid); a0=$(ticks $api_pids); w0=$(date +%s.%N)
    timeout 240 python3 -m pagedrt.entrypoints.cli bench serve --base-url "$url" \
      --vocab-size 49152 --out "$out/serve_api${n}_$name.json" "$@" >> "$log" 2>&1 \
      || echo "bench $name failed"
    c1=$(ticks $core_pid); a1=$(ticks $api_pids); w1=$(date +%s.%N)
    awk -v n="$name" -v c=$((c1 - c0)) -v a=$((a1 - a0)) -v hz="$hz" -v w0="$w0" -v w1="$w1" \
      'BEGIN { printf "cpu %-20s engine core %6.2f s, API processes %6.2f s, wall %6.2f s\n", n, c / hz, a / hz, w1 - w0 }' \
      | tee -a "$out/cpu.txt"
  }
  bs burst_512_128 --num-prompts 256 --input-len 512 --output-len 128 --request-rate inf \
    --num-client-processes "$clients" --seed 1
  bs burst_512_128_2x --num-prompts 256 --input-len 512 --output-len 128 --request-rate inf \
    --num-client-processes $((2 * clients)) --seed 3
  bs burst_128_512 --num-prompts 256 --input-len 128 --output-len 512 --request-rate inf \
    --num-client-processes "$clients" --seed 2
  bs nostream_512_128 --num-prompts 256 --input-len 512 --output-len 128 --request-rate inf \
    --num-client-processes "$clients" --no-stream --seed 4
  bs nostream_128_512 --num-prompts 256 --input-len 128 --output-len 512 --request-rate inf \
    --num-client-processes "$clients" --no-stream --seed 5
  # 1,024 requests, at most 256 in flight: a steady state against offline's 1,024 requests
  bs sustained_512_128 --num-prompts 1024 --max-concurrency 256 --input-len 512 --output-len 128 \
    --request-rate inf --num-client-processes "$clients" --seed 8
  bs sustained_128_512 --num-prompts 1024 --max-concurrency 256 --input-len 128 --output-len 512 \
    --request-rate inf --num-client-processes "$clients" --seed 9
  sleep 1
  # lone requests one after another on the idle server: 16 new prompts, then the same 16 again
  # (prefix-cache hits)
  bs lone_new --num-prompts 16 --max-concurrency 1 --input-len 512 --output-len 64 \
    --request-rate inf --seed 6
  bs lone_cached --num-prompts 16 --max-concurrency 1 --input-len 512 --output-len 64 \
    --request-rate inf --seed 6
  if [ "${SWEEP:-1}" = 1 ]; then
    bs sweep --num-prompts 256 --input-len 512 --output-len 128 --request-rate 8,32,128,inf \
      --num-client-processes "$clients" --seed 7 --plot "$out/serve_api${n}_sweep.png"
  fi
  if [ -d .whl-guidellm ] && [ "${GUIDELLM:-1}" = 1 ]; then
    BASE_URL="$url" TOKENIZER=.tok OUT="$out/guidellm" timeout 300 \
      bash benchmarks/guidellm_crosscheck.sh 2>&1 | tail -2 | tee -a "$log"
  fi
  kill -TERM "$server"
  wait "$server"
  echo "server (api $n) exit status $?"
  grep -h "engine core:" "$out/serve_api$n.log"
done
python3 benchmarks/trace_summary.py "$out" 2>&1 | tee -a "$log"
for f in "$out"/step_trace_api*.json; do
  [ -f "$f" ] && python3 benchmarks/diagnostics/step_trace.py "$f" --steps 8 > "${f%.json}.txt" 2>&1
done
python3 benchmarks/serve_summary.py "$out" 2>&1 | tee -a "$log"
# $OUT brings back at most 8 files: everything in one archive, beside the two short summaries
tar -czf /tmp/results.tgz -C "$out" . 2>/dev/null && mv /tmp/results.tgz "$out/results.tgz" \
  && find "$out" -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name cpu.txt \
       ! -name 'step_trace_api*.txt' -exec rm -rf {} +
