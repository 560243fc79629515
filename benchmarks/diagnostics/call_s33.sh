#!/usr/bin/env bash
# 2026-12-02 20:05 UTC (carry .commit and .whl; ~6 min). call_s32's Nsight Compute run: the FP8
# decode kernel (Llama-3-8B heads B64 L4096, 128/4/5) runs 255 registers per thread, so 2
# programs (8 warps) per SM, 12.4% occupancy, and stalls mostly on the short scoreboard
# (shared-memory reads) with 2 warps per scheduler to hide it; bf16 runs 125 registers, 4
# programs, at 91.7% of DRAM bandwidth.
# (1) At 5 stages a program takes 76.8 KB of shared memory, so 3 fit in an SM if the registers
#     allow: cap them at 168 (65,536 / (3 x 128), rounded down to 8) and near it; 8 warps.
# (2) The warp-tile kernel (pagedrt/ops/attention_decode_warp_triton.py: one 16-token slice of
#     each tile per warp, so the loop's softmax reductions stay inside a warp), bf16 and FP8,
#     against each shape's default in the same process.
set -u
. benchmarks/diagnostics/call_common.sh
tune regs --kv-cache-dtype fp8 --cases llama3-8b:64:4096,qwen2-0.5b:64:4096 \
  --block-n 64,128 --warps 4,8 --stages 5 --splits 0 --maxnreg 0,152,168,184
echo "== tune regs"; grep -E "^(llama|qwen)" "$out/r/tune_regs.txt" | tail -2 | cut -c1-330
tune warp --kv-cache-dtype both --cases llama3-8b:64:4096,qwen2-0.5b:64:4096,llama3-8b:8:8192 \
  --block-n 64,128 --warps 4,8 --stages 3,5 --splits 0 --warp-tiles 1
echo "== tune warp"; grep -E "^(llama|qwen)" "$out/r/tune_warp.txt" | tail -6 | cut -c1-330
tar -czf /tmp/results.tgz -C "$out" r && rm -rf "$out/r" && mv /tmp/results.tgz "$out/"
