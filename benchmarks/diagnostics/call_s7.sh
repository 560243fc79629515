#!/usr/bin/env bash
# Device calls of 2026-12-02 (session 6) for the Triton sampling race (carry .base .commit):
# its GPU tests and the spec GPU tests that need no GGUF; baca7b5 against HEAD on nano-vllm's
# workload in ABBA order (benchmarks/paired_h200.sh with REPEATS=0 LAT=0 NANO_REPEATS=N);
# then HEAD once more with PAGEDRT_SAMPLE_KERNEL=0 (the torch ops) for the kernel's share.
set -u
. benchmarks/diagnostics/call_common.sh
gpu_tests gpu_tests "${TEST_CAP:-120}" \
  ${GPU_TESTS:-tests/gpu/test_sample_triton_gpu.py tests/gpu/test_spec_decode_gpu.py}
BASE=.base BASE_COMMIT=baca7b5 REPEATS=0 LAT=0 NANO_REPEATS="${NANO_REPEATS:-3}" CAP=60 \
  OUT="$out/r/paired" timeout "${PAIRED_CAP:-300}" bash benchmarks/paired_h200.sh > "$out/r/paired.txt" 2>&1
echo "== paired"; tail -3 "$out/r/paired.txt"
PAGEDRT_SAMPLE_KERNEL=0 timeout 60 python3 -m pagedrt.entrypoints.cli bench throughput \
  --preset qwen2-0.5b --workload nanovllm --name head_nano_torchops --out "$out/r/paired" \
  > "$out/r/torchops.txt" 2>&1
echo "== head, torch ops (status $?)"
python3 - "$out/r/paired" <<'PY'
import glob, json, os, sys
print(f"{'run':<22} {'tok/s':>8} {'decode ms':>9} {'device ms':>9} {'sample ms':>9}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*nano*.json"))):
    r = json.load(open(path))["results"][0]
    t = r.get("step_times", {})
    print(f"{os.path.basename(path)[:-5]:<22} {r['output_tok_s']:>8,.0f} "
          f"{t.get('decode_step_ms_median', 0):>9.3f} {t.get('decode_model_device_ms_median', 0):>9.3f} "
          f"{r.get('step_split_ms', {}).get('sample', 0):>9.3f}")
PY
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
