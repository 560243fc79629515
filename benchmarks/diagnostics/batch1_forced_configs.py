"""Batch-1 decode latency with one op's tile config forced (issue 16): does the start-up timing
pick what is fastest inside the decode step? `fastest_config` times an op alone, replayed from
a CUDA graph after an L2 flush; in a step each kernel also overlaps the one before it (its
weight loads before the PDL wait), which the timing does not see. This runs the engine once
to let the timing choose everything, keeps those choices, then for each forced config of one
op (all others as chosen) builds a fresh engine on the Qwen2-0.5B preset's random weights
and times `pagedrt bench latency`'s decode ms per token at one context (the median of
--repeats). Rounds alternate the variants' order (forward, then backward) to expose drift. A
one-off diagnostic, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/batch1_forced_configs.py
        [--ops gate_up,down,o] [--context 512] [--rounds 2] [--repeats 3] [--out F.json]

Ops: gate_up = RMSNorm + gate/up projection (fused key, None = the unfused chain), down = SiLU
* up + down projection (fused key, None = unfused), o = the O projection (plain skinny matmul,
None = cuBLAS).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from pagedrt import LLM
from pagedrt.bench.common import free_llm
from pagedrt.bench.latency import decode_ms_per_token
from pagedrt.bench.presets import get_preset, random_model
from pagedrt.ops import gemv_triton

# op -> (the choice table it lives in, which key of it, the configs to force)
OPS = {
    "gate_up": ("fused", lambda k: k[0] == "rmsnorm" and tuple(k[1]) == (9728, 896)
                and k[2] == 1,
                [None, (4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 256, 4), (32, 128, 4),
                 (16, 512, 8), (32, 256, 8), (4, 1024, 4), (8, 1024, 8)]),
    "down": ("fused", lambda k: k[0] == "silu_mul" and tuple(k[1]) == (896, 4864)
             and k[2] == 1,
             [None, (4, 512, 4), (8, 512, 4), (4, 1024, 4), (4, 2048, 8), (2, 2048, 4),
              (8, 1024, 8)]),
    "o": ("plain", lambda k: tuple(k[0]) == (896, 896) and k[1] == 1,
          [None, (4, 512, 4), (8, 256, 4), (8, 512, 4), (4, 1024, 4), (4, 2048, 8),
           (2, 2048, 4)]),
}


def build(context: int) -> LLM:
    model = random_model(get_preset("qwen2-0.5b"), torch.bfloat16, torch.device("cuda"))
    return LLM(model, gpu_memory_utilization=0.4, max_num_seqs=8,
               max_model_len=context + 256)


def timed(context: int, repeats: int) -> float:
    llm = build(context)
    prompt = torch.randint(0, 10000, (context,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    decode_ms_per_token(llm, prompt, 16)  # warm-up
    ms = statistics.median(decode_ms_per_token(llm, prompt, 128) for _ in range(repeats))
    free_llm(llm)
    return ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="gate_up,down,o")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    chosen_ms = timed(args.context, args.repeats)  # the start-up timing makes every choice
    chosen = {"plain": dict(gemv_triton._CHOICE), "fused": dict(gemv_triton._FUSED_CHOICE)}
    tables = {"plain": gemv_triton._CHOICE, "fused": gemv_triton._FUSED_CHOICE}
    results = {"context": args.context, "as_chosen_ms": chosen_ms, "ops": {}}
    print(f"as chosen: {chosen_ms:.4f} ms/token", flush=True)
    for op in args.ops.split(","):
        table, match, configs = OPS[op]
        keys = [k for k in chosen[table] if match(k)]
        if len(keys) != 1:
            raise SystemExit(f"{op}: expected one key in the {table} table, found {keys}")
        key = keys[0]
        row = {"key": str(key), "chosen": chosen[table][key], "ms": {str(c): [] for c in configs}}
        for r in range(args.rounds):
            for cfg in (configs if r % 2 == 0 else configs[::-1]):
                for name, live in tables.items():
                    live.clear()
                    live.update(chosen[name])
                tables[table][key] = cfg
                row["ms"][str(cfg)].append(timed(args.context, args.repeats))
                print(f"{op} {cfg}: {row['ms'][str(cfg)][-1]:.4f}", flush=True)
        results["ops"][op] = row
        print(f"{op} ({table} key {key}; the timing chose {row['chosen']}):")
        for cfg, ms in row["ms"].items():
            print(f"  {cfg:16s} {' '.join(f'{m:.4f}' for m in ms)}  median "
                  f"{statistics.median(ms):.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
