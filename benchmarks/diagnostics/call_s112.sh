#!/usr/bin/env bash
# Issue 16's Qwen2-0.5B status rows on the next H200 in one call (carry .commit, .whl and
# .tcache; ~5 min): Triton's cache warmed (warm_qwen2_cache), then 256 x 512/128 with
# `--repeats 2` (its process times the kernel configs and files them in the config cache,
# which call_common.sh keeps inside the Triton cache), the batch sweep of record, batch-1
# latency and nano-vllm's workload, each process reading the choices the first one timed, the
# GPU's clocks sampled through each; the Triton cache back last ($OUT/tc.txz.NN: put them in
# .tcache/). Then call_s113.sh for the Llama-3-8B rows and issue 17's decode ratios.
# Summaries last; everything in $OUT/results.tgz.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
warm_qwen2_cache 150
status_bench main 170 --repeats 2
clocks_start sweep
sweep head
clocks_stop sweep
latency_run head 150
status_bench nano 150 --workload nanovllm --repeats 2
save_triton_cache
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
