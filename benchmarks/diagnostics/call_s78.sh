#!/usr/bin/env bash
# Issue 16, batches 8-128 (carry .commit, .whl and .base = `git archive 5db82a9 pagedrt`;
# ~9 min): the start-up timing with an L2 flush (fastest_config, PAGEDRT_COLD_L2_TIMING) also
# picks the 8-128-row matmul's configs: Qwen2-0.5B 512/128 at batches 8-128 with --repeats 3,
# HEAD then the tree before (run from inside .base, so that `python -m` imports that tree:
# the working directory comes first on sys.path, before PYTHONPATH).
set -u
. benchmarks/diagnostics/call_common.sh
sweep() {  # name, directory to run in
  (cd "$2" && PYTHONPATH="/tmp/site:$PWD" timeout 250 python3 -m pagedrt.entrypoints.cli \
    bench throughput --preset qwen2-0.5b --skip-step-split --batch-sizes 8,32,64,128 \
    --repeats 3 --name "sweep_$1" --out "$out/r" > "$out/r/sweep_$1.txt" 2>&1)
  echo "sweep_$1 status $?: $(grep -E "^pagedrt +qwen" "$out/r/sweep_$1.txt" | tr -s ' ' \
    | cut -d' ' -f3,4,6 | tr '\n' ' ')"
}
out="$(cd "$out" && pwd)"
sweep new .
sweep base .base
rm -f "$out"/r/*.png
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
