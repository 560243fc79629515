#!/usr/bin/env bash
# Cross-check `pagedrt bench serve` with guidellm 0.8.1 (the load generator vLLM's docs name)
# against an already running OpenAI-compatible server, on the lent GPU machine (no registry).
# Run from the repository root, with guidellm and its missing dependencies as cp312 wheels in
# .whl-guidellm/ (git-ignored; carried) and the server's wheels in .whl/ (for pydantic):
#
#   BASE_URL=http://127.0.0.1:8000 TOKENIZER=.tok OUT=out bash benchmarks/guidellm_crosscheck.sh
#
# One benchmark: NUM_REQUESTS synthetic /v1/completions requests (streamed, ignore_eos) of
# INPUT_LEN prompt and OUTPUT_LEN output tokens (counted with the TOKENIZER folder), at a fixed
# concurrency of CONCURRENCY streams. guidellm's JSON goes to $OUT/guidellm.json, its log and
# tables to $OUT/guidellm.log; a one-line summary is printed last.
#
# Validated on the CPU dev machine (Python 3.12.1 venv shaped like the GPU image: torch 2.11,
# transformers 5.17, tokenizers 0.23, huggingface-hub 1.33, click 8.5; the same pip --target
# installs and PYTHONPATH as here) against `pagedrt serve --device cpu --port 8123
# --num-kv-blocks 512 --max-model-len 2048` (SmolLM2-135M, its tokenizer folder from
# ~/.cache/pagedrt) with INPUT_LEN=64 OUTPUT_LEN=16 NUM_REQUESTS=8 CONCURRENCY=4: 8/8 requests
# completed, 64/16 tokens each; the same command line as below.
set -u
url="${BASE_URL:-http://127.0.0.1:8000}"
tok="${TOKENIZER:-.tok}"
out="${OUT:-out}"
in_len="${INPUT_LEN:-512}"
out_len="${OUTPUT_LEN:-128}"
n="${NUM_REQUESTS:-256}"
conc="${CONCURRENCY:-256}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
[ -d "$tok" ] || { echo "guidellm_crosscheck: TOKENIZER folder '$tok' not found"; exit 1; }
tok="$(cd "$tok" && pwd)"

# The server's wheels (pydantic 2.14 and friends) live in /tmp/site; install them if absent.
if [ ! -d /tmp/site ] && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site-guidellm .whl-guidellm/*.whl || exit 1
pp="/tmp/site-guidellm"
[ -d /tmp/site ] && pp="/tmp/site:$pp"
export PYTHONPATH="$pp${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false

for _ in $(seq 1 60); do
  curl -sf "$url/health" > /dev/null && break
  sleep 1
done
curl -sf "$url/health" > /dev/null || { echo "guidellm_crosscheck: no server at $url"; exit 1; }

rm -f "$out/guidellm.json"
timeout 300 python3 -m guidellm run \
  --backend "kind=openai_http,target=$url,request_format=/v1/completions" \
  --tokenizer "kind=huggingface_auto,model=$tok" \
  --data "kind=synthetic_text,prompt_tokens=$in_len,output_tokens=$out_len" \
  --profile "kind=concurrent,streams=$conc" \
  --constraint "kind=max_requests,count=$n" \
  --output "kind=json,path=$out/guidellm.json" \
  --disable-console-interactive > "$out/guidellm.log" 2>&1
rc=$?
[ "$rc" = 0 ] || { echo "guidellm exit status $rc; last lines of $out/guidellm.log:"; tail -20 "$out/guidellm.log"; }

python3 - "$out/guidellm.json" <<'EOF'
import json, sys
try:
    b = json.load(open(sys.argv[1]))["benchmarks"][0]
except Exception as e:  # no JSON: guidellm failed or timed out
    sys.exit(f"guidellm: no results ({e})")
m = b["metrics"]
def p50(k):
    s = m.get(k, {}).get("successful", {})
    return s.get("median", float("nan"))
t = m["request_totals"]
print(f"guidellm {b['config']['strategy'].get('type_')}@{b['config']['strategy'].get('streams')}: "
      f"{t['successful']}/{t['total']} ok, {t['errored']} errored, {b['duration']:.1f} s; "
      f"output {m['output_tokens_per_second']['successful']['mean']:.1f} tok/s, "
      f"total {m['tokens_per_second']['successful']['mean']:.1f} tok/s, "
      f"{m['requests_per_second']['successful']['mean']:.2f} req/s; "
      f"TTFT p50 {p50('time_to_first_token_ms'):.1f} ms, ITL p50 {p50('inter_token_latency_ms'):.2f} ms, "
      f"TPOT p50 {p50('time_per_output_token_ms'):.2f} ms, "
      f"E2EL p50 {p50('request_latency') * 1000:.0f} ms")
EOF
exit "$rc"
