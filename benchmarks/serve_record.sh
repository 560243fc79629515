#!/usr/bin/env bash
# Issue-13 figures in one device call: offline `LLM.generate` and `pagedrt serve` on the same
# random-weight Qwen2-0.5B folder (SmolLM2's tokenizer), measured back to back. Run from the
# repository root on the GPU machine, with the server's wheels in .whl/ and SmolLM2's tokenizer
# folder in .tok/ (benchmarks/README.md, "Running on the lent H200"):
#
#   PAGEDRT_COMMIT=<hash> API_SERVERS="1 4" bash benchmarks/serve_record.sh   # results in $OUT
#
# Steps: offline 256 x 512/128 and 256 x 128/512; then for each API-server count: a burst of 256
# streams of each workload, the same not streamed, the first with twice the client processes,
# a lone request (new prompt, then the same prompt again: a prefix-cache hit) on the idle
# server, and a request-rate sweep. A summary table is printed last.
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
model=/tmp/qwen2-0.5b-random
clients="${CLIENTS:-4}"
engine_opts="--max-num-batched-tokens 16384 --max-model-len 4096 --gpu-memory-utilization 0.85"
pagedrt() { python3 -m pagedrt.entrypoints.cli "$@"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$log"
[ -d "$model" ] || python3 benchmarks/make_random_folder.py --preset qwen2-0.5b --tokenizer .tok \
  --out "$model" 2>&1 | grep -v shards | tee -a "$log"

if [ "${SKIP_OFFLINE:-0}" != 1 ]; then
  if [ "${PRESET_TOO:-0}" = 1 ]; then  # the preset's own random weights, as in BENCHMARKS.md
    timeout 300 python3 -m pagedrt.entrypoints.cli bench throughput --preset qwen2-0.5b \
      --name preset_512_128 --out "$out" >> "$log" 2>&1
    grep -h -A1 "^system" "$log" | tail -1
  fi
  for w in "512 128" "128 512"; do
    set -- $w
    timeout 300 python3 -m pagedrt.entrypoints.cli bench throughput --model "$model" \
      --num-requests 256 --input-len "$1" --output-len "$2" --name "offline_${1}_${2}" \
      --out "$out" >> "$log" 2>&1
    grep -h -A1 "^system" "$log" | tail -2
  done
fi

for n in ${API_SERVERS:-1}; do
  port=$((8000 + n))
  url="http://127.0.0.1:$port"
  python3 -m pagedrt.entrypoints.cli serve --model "$model" --port "$port" \
    --api-server-count "$n" $engine_opts > "$out/serve_api$n.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    curl -sf "$url/health" > /dev/null && break
    sleep 0.5
  done
  head -3 "$out/serve_api$n.log"
  bs() {  # name, then bench-serve options
    local name=$1; shift
    timeout 240 python3 -m pagedrt.entrypoints.cli bench serve --base-url "$url" \
      --vocab-size 49152 --out "$out/serve_api${n}_$name.json" "$@" >> "$log" 2>&1 \
      || echo "bench $name failed"
  }
  bs burst_512_128 --num-prompts 256 --input-len 512 --output-len 128 --request-rate inf \
    --num-client-processes "$clients" --seed 1
  bs burst_128_512 --num-prompts 256 --input-len 128 --output-len 512 --request-rate inf \
    --num-client-processes "$clients" --seed 2
  bs burst_512_128_2x --num-prompts 256 --input-len 512 --output-len 128 --request-rate inf \
    --num-client-processes $((2 * clients)) --seed 3
  bs nostream_512_128 --num-prompts 256 --input-len 512 --output-len 128 --request-rate inf \
    --num-client-processes "$clients" --no-stream --seed 4
  bs nostream_128_512 --num-prompts 256 --input-len 128 --output-len 512 --request-rate inf \
    --num-client-processes "$clients" --no-stream --seed 5
  sleep 1
  bs lone_new --num-prompts 1 --input-len 512 --output-len 64 --request-rate inf --seed 6
  bs lone_cached --num-prompts 1 --input-len 512 --output-len 64 --request-rate inf --seed 6
  if [ "${SWEEP:-1}" = 1 ]; then
    bs sweep --num-prompts 256 --input-len 512 --output-len 128 --request-rate 8,32,128,inf \
      --num-client-processes "$clients" --seed 7 --plot "$out/serve_api${n}_sweep.png"
  fi
  kill -TERM "$server"
  wait "$server"
  echo "server (api $n) exit status $?"
done
if [ -n "${PROFILE_API_SERVERS:-}" ]; then  # one burst under cProfile (figures not kept)
  n=$PROFILE_API_SERVERS
  url="http://127.0.0.1:8100"
  PAGEDRT_PROFILE_DIR="$out/prof" python3 -m pagedrt.entrypoints.cli serve --model "$model" \
    --port 8100 --api-server-count "$n" $engine_opts > "$out/serve_prof.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do curl -sf "$url/health" > /dev/null && break; sleep 0.5; done
  timeout 240 python3 -m pagedrt.entrypoints.cli bench serve --base-url "$url" --vocab-size 49152 \
    --num-prompts 256 --input-len 128 --output-len 512 --request-rate inf \
    --num-client-processes "$clients" --seed 9 > "$out/prof_bench.log" 2>&1
  kill -TERM "$server"; wait "$server"
  tail -3 "$out/serve_prof.log"
  for f in "$out"/prof/*.prof; do
    echo "== $f"; python3 -c "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(18)" "$f" 2>&1 | tail -24
  done > "$out/prof_top.txt"
fi
python3 benchmarks/serve_summary.py "$out" 2>&1 | tee -a "$log"
tar -czf "$out/results.tgz" -C "$out" --exclude results.tgz --exclude prof . 2>/dev/null
