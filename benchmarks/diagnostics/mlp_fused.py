"""The whole 1-4-row MLP in one kernel (pagedrt/ops/mlp_triton.py) against the two-kernel
chain it would replace, timed alone as the engine's start-up timing times them: a bf16
`LlamaMLP` of each shape with random weights runs `forward_normed` once per row count, which
times the chain's own fused ops and then the whole-MLP configs against the chain
(`fused_or_unfused`: CUDA graphs, a cold L2); this prints what that timing filed in
`config_timing.TIMED`, after checking the chosen path against the plain modules. A diagnostic
for issue 16, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/mlp_fused.py [--rows 1,2,4] [--out F.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from pagedrt.config import ModelConfig
from pagedrt.models.layers import RMSNorm
from pagedrt.models.llama import LlamaMLP
from pagedrt.ops import config_timing, gemv_triton

SHAPES = {"qwen2-0.5b": (896, 4864), "llama3-8b": (4096, 14336)}  # (hidden, intermediate)


def _mlp(hidden: int, inter: int, g: torch.Generator) -> tuple[LlamaMLP, RMSNorm]:
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=32, hidden_size=hidden,
                         intermediate_size=inter, num_hidden_layers=1, num_attention_heads=8,
                         num_key_value_heads=8, head_dim=hidden // 8)
    mlp, norm = LlamaMLP(config), RMSNorm(hidden, 1e-6)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        norm.weight.copy_(1 + 0.2 * torch.randn(hidden, generator=g))
    return mlp.to("cuda", torch.bfloat16), norm.to("cuda", torch.bfloat16)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    results = []
    for name, (hidden, inter) in SHAPES.items():
        mlp, norm = _mlp(hidden, inter, g)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, hidden, generator=g).to("cuda", torch.bfloat16)
            residual = torch.randn(m, hidden, generator=g).to("cuda", torch.bfloat16)
            with torch.no_grad():
                y, new_residual = mlp.forward_normed(norm, x, residual)
                h, want_residual = norm.forward_pair(x, residual)
                want = torch.nn.functional.linear(
                    mlp.act_fn(torch.nn.functional.linear(h, mlp.gate_up_proj.weight)),
                    mlp.down_proj.weight)
            err = (y.float() - want.float()).abs().max().item()
            key = next(k for k in gemv_triton._FUSED_CHOICE
                       if k[0] == "mlp" and k[1] == (2 * inter, hidden) and k[2] == m)
            times = config_timing.TIMED[id(gemv_triton._FUSED_CHOICE), key][2]
            chain_us = times[None] * 1e3
            row = {"shape": name, "rows": m, "chain_us": chain_us,
                   "chosen": gemv_triton._FUSED_CHOICE[key], "max_abs_err": err,
                   "max_abs_want": want.abs().max().item(),
                   "same_residual": bool(torch.equal(new_residual, want_residual)),
                   "configs_us": {str(c): t * 1e3 for c, t in times.items() if c is not None}}
            results.append(row)
            best = min(row["configs_us"].items(), key=lambda kv: kv[1])
            print(f"{name:10s} rows {m}: chain {chain_us:7.2f} us, best whole-MLP {best[1]:7.2f}"
                  f" us {best[0]} ({best[1] / chain_us:.2f}x), chosen {row['chosen']}; "
                  f"max |err| {err:.3g} of {row['max_abs_want']:.3g}, residual "
                  f"{'same' if row['same_residual'] else 'DIFFERS'}", flush=True)
            for cfg, us in row["configs_us"].items():
                print(f"    {cfg:22s} {us:7.2f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
