#!/usr/bin/env bash
# call_s146.sh's batch-1 A/B again on a warm cache (both trees' choices in the config cache
# the previous call saved; carry .commit, .whl, .tcache and .base; ~3 min): ABBA twice, one
# `pagedrt bench latency --preset qwen2-0.5b --contexts 512,4096 --graphs on --repeats 3`
# process each, base 9f4b5df against this tree.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
BASE_COMMIT=9f4b5df  # lat_tree (call_common.sh): .base holds its pagedrt/
lat_tree base lat_base_1 60
lat_tree head lat_head_2 60
lat_tree head lat_head_3 60
lat_tree base lat_base_4 60
lat_tree base lat_base_5 60
lat_tree head lat_head_6 60
lat_tree head lat_head_7 60
lat_tree base lat_base_8 60
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
echo "call done at ${SECONDS}s"
