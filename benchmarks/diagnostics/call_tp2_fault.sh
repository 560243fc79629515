#!/usr/bin/env bash
# For a lease of two GPUs (kind nvidia-h200-x2; carry .commit and .whl; ~6 min): the
# tensor-parallel GPU tests, among them two torchrun "nodes" on one machine (NCCL, one GPU
# each) with rank 1's worker killed mid-generation: rank 0 must fail its requests within
# seconds (Executor._wait_device, 3dfa4cd), not at the collective's time-out.
set -u
. benchmarks/diagnostics/call_common.sh
out="$(cd "$out" && pwd)"
gpu_tests tp_gpu 500 tests/gpu/test_tp_gpu.py
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
