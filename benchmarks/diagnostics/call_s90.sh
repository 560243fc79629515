#!/usr/bin/env bash
# Issue 16, batch 1 (carry .commit, .whl, .tcache; ~5 min): call_s89 found batch-1 steps steady
# within a process (0.627 ms, six runs) but 0.615 or 0.889 ms/token between fresh processes,
# and in a slow process the device idle 256 us per step (host-bound). Fresh processes of
# batch1_steps.py, each with its host phases per step (no synchronize) and the CPUs it ran on:
# four unpinned, then pinned to cores 0-1, 6-7 and 14-15; the machine's CPU topology first.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA|CPU MHz|CPU max)" ; nvidia-smi topo -m | head -4
for i in 1 2 3 4; do
  timeout 60 python3 benchmarks/diagnostics/batch1_steps.py --runs 2 > "$out/r/b1_free$i.txt" 2>&1
  echo "free$i status $?"; grep -E "^(process|run|  )" "$out/r/b1_free$i.txt" | tail -4
done
for c in 0-1 6-7 14-15; do
  timeout 60 taskset -c $c python3 benchmarks/diagnostics/batch1_steps.py --runs 2 > "$out/r/b1_pin$c.txt" 2>&1
  echo "pin $c status $?"; grep -E "^(run|  )" "$out/r/b1_pin$c.txt" | tail -2
done
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
