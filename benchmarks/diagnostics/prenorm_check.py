"""The RMSNorm-in-the-prologue kernels (PAGEDRT_MATMUL_PRE_NORM; docs/design.md, "Decode
matmuls (8 to 128 rows)") against the chain they replace, on a GPU, in bf16 at Qwen2-0.5B's
shapes: first each fused kernel's output and new residual against `rms_norm_triton` then the
same kernel without the norm (one config each), then the time of 24 layers' worth of each
(24 distinct weights, so they come from HBM as in a step, not from L2) captured in one CUDA
graph, chain against fused, per layer. A quick diagnostic for one short call, not a benchmark
of record; the engine's own choice is timed at start-up (`matmul_triton._choice`).

    PYTHONPATH=$PWD python3 -u benchmarks/diagnostics/prenorm_check.py [--rows 8,64]
"""

from __future__ import annotations

import argparse

import torch

from pagedrt.models.layers import RotaryEmbedding
from pagedrt.ops.fused_triton import rms_norm_triton
from pagedrt.ops.matmul_rope_triton import CONFIGS as ROPE_CONFIGS
from pagedrt.ops.matmul_rope_triton import matmul_qkv_rope_triton, matmul_rmsnorm_qkv_rope_triton
from pagedrt.ops.matmul_triton import SILU_CONFIGS, matmul_rmsnorm_triton, matmul_triton

HIDDEN, INTER, HEADS, KV_HEADS, D, LAYERS = 896, 4864, 14, 2, 64, 24


def graph_us(fn, replays: int = 20) -> float:
    """us per call of fn() (24 layers' launches) captured in a CUDA graph, median replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def check_rows(m: int, w_qkv: list, w_gu: list, cos_sin: torch.Tensor,
               g: torch.Generator) -> None:
    """The correctness line and the two timing lines at m rows."""
    dev, bf16, eps = "cuda", torch.bfloat16, 1e-6
    silu_cfg, rope_cfg = SILU_CONFIGS[0], ROPE_CONFIGS[0]
    x = torch.randn(m, HIDDEN, device=dev, generator=g).to(bf16)
    r = torch.randn(m, HIDDEN, device=dev, generator=g).to(bf16)
    nw = (1 + 0.1 * torch.randn(HIDDEN, device=dev, generator=g)).to(bf16)
    positions = torch.randint(0, 4000, (m,), device=dev, generator=g)
    slots = torch.arange(m, device=dev)
    caches = torch.zeros(2, 2, m // 16 + 2, 16, KV_HEADS, D, device=dev, dtype=bf16)
    h, want_r = rms_norm_triton(x, nw, eps, r)
    act, got_r = matmul_rmsnorm_triton(x, r, nw, eps, w_gu[0], None, silu_cfg, True)
    want = matmul_triton(h, w_gu[0], None, silu_cfg, True)
    err_gu = ((act.float() - want.float()).abs().max().item(), torch.equal(got_r, want_r))
    qkv, got_r = matmul_rmsnorm_qkv_rope_triton(x, r, nw, eps, w_qkv[0], None, positions,
                                                cos_sin, *caches[0], slots, HEADS,
                                                KV_HEADS, rope_cfg)
    want = matmul_qkv_rope_triton(h, w_qkv[0], None, positions, cos_sin, *caches[1], slots,
                                  HEADS, KV_HEADS, rope_cfg)
    err_qkv = ((qkv.float() - want.float()).abs().max().item(), torch.equal(got_r, want_r),
               (caches[0].float() - caches[1].float()).abs().max().item())
    print(f"rows {m}: gate/up max |diff| {err_gu[0]:.3g}, residual equal {err_gu[1]}; "
          f"qkv+rope max |diff| {err_qkv[0]:.3g}, residual equal {err_qkv[1]}, "
          f"cache max |diff| {err_qkv[2]:.3g}", flush=True)

    def chain_gu():
        for w in w_gu:
            hh, _ = rms_norm_triton(x, nw, eps, r, validate=False)
            matmul_triton(hh, w, None, silu_cfg, True)

    def fused_gu():
        for w in w_gu:
            matmul_rmsnorm_triton(x, r, nw, eps, w, None, silu_cfg, True)

    def chain_qkv():
        for w in w_qkv:
            hh, _ = rms_norm_triton(x, nw, eps, r, validate=False)
            matmul_qkv_rope_triton(hh, w, None, positions, cos_sin, *caches[1], slots,
                                   HEADS, KV_HEADS, rope_cfg)

    def fused_qkv():
        for w in w_qkv:
            matmul_rmsnorm_qkv_rope_triton(x, r, nw, eps, w, None, positions, cos_sin,
                                           *caches[0], slots, HEADS, KV_HEADS, rope_cfg)

    for name, a, b in (("gate/up + SwiGLU", chain_gu, fused_gu),
                       ("QKV + RoPE", chain_qkv, fused_qkv)):
        ta, tb = graph_us(a) / LAYERS, graph_us(b) / LAYERS
        ta2, tb2 = graph_us(a) / LAYERS, graph_us(b) / LAYERS
        print(f"rows {m} {name}: norm kernel + matmul {ta:.2f} / {ta2:.2f} us, norm in "
              f"the prologue {tb:.2f} / {tb2:.2f} us per layer "
              f"(ratio {(tb + tb2) / (ta + ta2):.3f})", flush=True)



def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="8,64")
    args = p.parse_args()
    dev, bf16 = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    cos_sin = RotaryEmbedding(D, 4096, 1e6).cos_sin_cache.to(dev)
    n_qkv = (HEADS + 2 * KV_HEADS) * D
    w_qkv = [(torch.randn(n_qkv, HIDDEN, device=dev, generator=g) * 0.02).to(bf16)
             for _ in range(LAYERS)]
    w_gu = [(torch.randn(2 * INTER, HIDDEN, device=dev, generator=g) * 0.02).to(bf16)
            for _ in range(LAYERS)]
    for m in (int(r) for r in args.rows.split(",")):
        check_rows(m, w_qkv, w_gu, cos_sin, g)


if __name__ == "__main__":
    main()
