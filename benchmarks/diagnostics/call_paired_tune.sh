#!/usr/bin/env bash
# Device calls of 2026-12-01, session 3. PART=paired: the baca7b5/HEAD offline runs
# (benchmarks/paired_h200.sh); PART=tune: the worker-process memory-release timeline
# (diagnostics/mp_release.sh) and a decode-kernel sweep over bf16 and FP8 caches
# (decode_tune.py). Each capped to fit in 570 s; tables printed last, files packed into
# $OUT/results.tgz.
set -u
out="${OUT:-out}"; mkdir -p "$out/r"
export PYTHONPATH="$PWD"
left() { echo $((570 - SECONDS)); }
if [ "${PART:-paired}" = paired ]; then
    BASE=.base BASE_COMMIT=baca7b5 REPEATS="${REPEATS:-2}" CAP=75 OUT="$out/r/paired" \
        timeout $(( $(left) - 10 )) bash benchmarks/paired_h200.sh > "$out/r/paired.txt" 2>&1
    echo "== paired"; tail -7 "$out/r/paired.txt"
else
    OUT="$out/r/mp" timeout 60 bash benchmarks/diagnostics/mp_release.sh > "$out/r/mp.txt" 2>&1
    timeout $(( $(left) - 15 )) python3 benchmarks/decode_tune.py --out "$out/r/tune" \
        --small-grid --kv-cache-dtype both \
        --cases llama3-8b:64:4096,qwen2-0.5b:64:2048,qwen2-0.5b:64:4096 > "$out/r/tune.txt" 2>&1
    echo "== mp release"; tail -12 "$out/r/mp.txt"
    echo "== decode tune"
    grep -E "^(llama3|qwen2|smollm2)" "$out/r/tune.txt" | cut -c1-170 | awk '!s[$0]++'
fi
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
