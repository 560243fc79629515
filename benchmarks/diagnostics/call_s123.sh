#!/usr/bin/env bash
# The 16-bit warp-tile decode's split target (PAGEDRT_DECODE_PROGRAMS_PER_SM, issue 16): 4 by
# default, from kernel timings at contexts of 2,048 and more; the batch-64 decode step at
# context 512 spent 246 of 1,123 us in the attention and its reduce (call_s119). The sweep of
# record and nano-vllm's workload at 4 / 8 / 16 (ABAB, the same timed choices: the setting is
# not in the config cache's fingerprint), and the batch-64 timeline at 4 and 8. One GPU;
# carry .commit, .whl and .tcache; ~5 min.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
sw() {  # name, programs per SM, cap
  local t0=$SECONDS
  PAGEDRT_DECODE_PROGRAMS_PER_SM=$2 timeout "$3" python3 -m pagedrt.entrypoints.cli bench \
    throughput --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 --repeats 2 \
    --name "sw_$1" --out "$out/r" > "$out/r/sw_$1.txt" 2>&1
  echo "sw_$1 (PAGEDRT_DECODE_PROGRAMS_PER_SM=$2) status $? in $((SECONDS - t0))s: $(grep -E \
    "^pagedrt +qwen" "$out/r/sw_$1.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
nano() {  # name, programs per SM
  local t0=$SECONDS
  PAGEDRT_DECODE_PROGRAMS_PER_SM=$2 timeout 60 python3 -m pagedrt.entrypoints.cli bench \
    throughput --preset qwen2-0.5b --skip-step-split --workload nanovllm --repeats 2 \
    --name "nano_$1" --out "$out/r" > "$out/r/nano_$1.txt" 2>&1
  echo "nano_$1 (PAGEDRT_DECODE_PROGRAMS_PER_SM=$2) status $? in $((SECONDS - t0))s: $(grep \
    -E "^pagedrt +qwen" "$out/r/nano_$1.txt" | tr -s ' ' | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
sw p4a 4 170
sw p8a 8 60
sw p16a 16 60
sw p4b 4 60
sw p8b 8 60
nano p4 4
nano p8 8
for p in 4 8; do
  [ $SECONDS -lt 450 ] || break
  PAGEDRT_DECODE_PROGRAMS_PER_SM=$p timeout 60 python3 benchmarks/diagnostics/decode_timeline.py \
    --batch 64 --context 512 --steps 32 --out "$out/r/tl_b64_p$p.json" > "$out/r/tl_b64_p$p.txt" 2>&1
  echo "tl_b64 p$p status $?"; grep -E "^wall|^batch|_decode|^total" "$out/r/tl_b64_p$p.txt" | head -6
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
