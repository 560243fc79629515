"""The 1-4-row ops that replace two kernels with one, against their chains, timed alone as
the engine's start-up timing times them (`fused_or_unfused`: CUDA graphs, a cold L2): the
whole MLP (pagedrt/ops/mlp_triton.py) against the fused norm + gate/up and SiLU + down, and
the attention's combine with the O projection (pagedrt/ops/attn_o_triton.py) against the
reduce kernel and the O projection, over a batch-1 graph's 64 decode partitions at contexts
of 512 tokens. bf16 layers of each shape with random weights run once per row count, which
times the chain's own ops and then the one-kernel configs; this prints what that timing filed
in `config_timing.TIMED`, after checking the result against the plain modules. A diagnostic
for issue 16, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/fused_vs_chain.py [--rows 1,2,4] [--out F.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from pagedrt.config import ModelConfig
from pagedrt.models.layers import RMSNorm
from pagedrt.models.llama import LlamaAttention, LlamaMLP
from pagedrt.ops import config_timing, gemv_triton
from pagedrt.ops.attention_triton import paged_attention_decode_triton, reduce_partials

# (hidden, intermediate, heads, kv heads, head_dim)
SHAPES = {"qwen2-0.5b": (896, 4864, 14, 2, 64), "llama3-8b": (4096, 14336, 32, 8, 128)}


def _config(hidden, inter, heads, kv_heads, head_dim) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=32, hidden_size=hidden,
                       intermediate_size=inter, num_hidden_layers=1, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim)


def _timed(op: str, shape: tuple, m: int) -> tuple[tuple, dict]:
    """(the choice, {config or None: ms}) the timing filed for `op` at `shape` and m rows."""
    key = next(k for k in gemv_triton._FUSED_CHOICE
               if k[0] == op and k[1] == shape and k[2] == m)
    return (gemv_triton._FUSED_CHOICE[key],
            config_timing.TIMED[id(gemv_triton._FUSED_CHOICE), key][2])


def _report(results: list, name: str, op: str, m: int, shape: tuple, err: float,
            scale: float, extra: dict) -> None:
    chosen, times = _timed(op, shape, m)
    row = {"shape": name, "op": op, "rows": m, "chain_us": times[None] * 1e3,
           "chosen": chosen, "max_abs_err": err, "max_abs_want": scale, **extra,
           "configs_us": {str(c): t * 1e3 for c, t in times.items() if c is not None}}
    results.append(row)
    best = min(row["configs_us"].items(), key=lambda kv: kv[1])
    print(f"{name:10s} {op:6s} rows {m}: chain {row['chain_us']:7.2f} us, best one-kernel "
          f"{best[1]:7.2f} us {best[0]} ({best[1] / row['chain_us']:.2f}x), chosen {chosen}; "
          f"max |err| {err:.3g} of {scale:.3g}", flush=True)
    for cfg, us in row["configs_us"].items():
        print(f"    {cfg:22s} {us:7.2f} us")


def _attn_o(shape: tuple, m: int, g: torch.Generator, results: list, name: str) -> None:
    """The combine + O projection over a batch-1 graph's 64 partitions, contexts of 512."""
    hidden, _, heads, kv_heads, d = shape
    attn = LlamaAttention(_config(*shape)).to("cuda", torch.bfloat16)
    with torch.no_grad():
        attn.o_proj.weight.copy_(torch.randn(hidden, hidden, generator=g) / hidden ** 0.5)
    blocks = 128  # 2,048 tokens a row: 64 partitions of one 32-token tile, as the graphs split
    k_cache = torch.randn(m * blocks + 1, 16, kv_heads, d, generator=g).to("cuda",
                                                                          torch.bfloat16)
    tables = (torch.randperm(m * blocks, generator=g) + 1).view(m, blocks).to("cuda",
                                                                              torch.int32)
    query = torch.randn(m, heads, d, generator=g).to("cuda", torch.bfloat16)
    parts = paged_attention_decode_triton(
        query, k_cache, k_cache, tables, torch.full((m,), 512, dtype=torch.int32,
                                                    device="cuda"),
        d ** -0.5, num_splits=64, partials=True)
    with torch.no_grad():
        y = attn._o_proj_of(parts)
        want = F.linear(reduce_partials(parts).flatten(1), attn.o_proj.weight)
    _report(results, name, "attn_o", m, (hidden, hidden),
            (y.float() - want.float()).abs().max().item(), want.abs().max().item(), {})


def _mlp(hidden: int, inter: int, g: torch.Generator, shape: tuple
         ) -> tuple[LlamaMLP, RMSNorm]:
    """A bf16 MLP with weights N(0, 1 / fan_in) and its norm, on CUDA."""
    mlp, norm = LlamaMLP(_config(*shape)), RMSNorm(hidden, 1e-6)
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
    for name, shape in SHAPES.items():
        hidden, inter = shape[:2]
        mlp, norm = _mlp(hidden, inter, g, shape)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, hidden, generator=g).to("cuda", torch.bfloat16)
            residual = torch.randn(m, hidden, generator=g).to("cuda", torch.bfloat16)
            with torch.no_grad():
                y, new_residual = mlp.forward_normed(norm, x, residual)
                h, want_residual = norm.forward_pair(x, residual)
                want = F.linear(mlp.act_fn(F.linear(h, mlp.gate_up_proj.weight)),
                                mlp.down_proj.weight)
            _report(results, name, "mlp", m, (2 * inter, hidden),
                    (y.float() - want.float()).abs().max().item(), want.abs().max().item(),
                    {"same_residual": bool(torch.equal(new_residual, want_residual))})
            _attn_o(shape, m, g, results, name)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
