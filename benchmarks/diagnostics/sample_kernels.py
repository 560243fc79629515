"""Times the sampler's last kernel alone on the GPU (pagedrt/ops/sample_triton.py, "Split
rows"): for B rows of V logits, torch.argmax against `argmax_triton` (greedy batches), and the
race over a noise tensor, one program a row against the split launch (`sample_splits`' count
for this GPU), and the noise tensor's draw with its race. Each kernel is checked against its reference
first, then timed by triton.testing.do_bench_cudagraph after a write of twice the L2's size
(the logits come from DRAM, as after the LM head of a large batch) whose own time is
subtracted; the bytes read per us give the bandwidth. The sampling kernels time 1-256 rows
in bf16 in about a minute on an H100 (2026-12-06); float32 runs after them.

    python3 benchmarks/diagnostics/sample_kernels.py [--rows 1,8,64,256] [--vocab 151936]
        [--out results.json]

Prints one line per (rows, dtype, kernel): us, GB/s of logits and noise moved, and the
speed-up of the split launch over the unsplit one (over torch.argmax for the greedy batch).
(The race drawing its noise in registers from Philox counters was timed here too until
2026-12-06, slower than the draw and the race over the tensor; it was removed.)
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton.testing

from pagedrt.ops.sample_triton import (
    argmax_triton,
    race_argmax_triton,
    sample_splits,
)
from pagedrt.ops.triton_utils import device_sms


def timed_us(fn, flush: torch.Tensor) -> float:
    """Median us of fn() after a write of `flush`, less the write's own median, both replayed
    from CUDA graphs (device time: no host launch cost)."""
    both = triton.testing.do_bench_cudagraph(lambda: (flush.zero_(), fn()), rep=60,
                                             return_mode="median")
    alone = triton.testing.do_bench_cudagraph(flush.zero_, rep=60, return_mode="median")
    return max(both - alone, 0.0) * 1e3


BASES = {"argmax_triton": "torch.argmax", "race split": "race"}
CHECKS = [("argmax_triton", "torch.argmax"), ("race split", "race")]


def measure(rows: int, vocab: int, dtype: torch.dtype, flush: torch.Tensor) -> list[dict]:
    """Every case at one shape, checked, then timed: one dict per case."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 4).to(dtype)
    noise = torch.empty(rows, vocab, device="cuda").exponential_(generator=g)
    temperature = torch.full((rows,), 0.6, device="cuda")
    greedy = torch.zeros(rows, dtype=torch.bool, device="cuda")
    splits = sample_splits(rows, vocab, device_sms(logits))
    cases = {
        "torch.argmax": lambda: logits.argmax(-1),
        "argmax_triton": lambda: argmax_triton(logits),
        "race": lambda: race_argmax_triton(logits, noise, temperature, greedy),
        "race split": lambda: race_argmax_triton(logits, noise, temperature, greedy, splits),
        # the noise tensor's draw too (exponential_)
        "draw + race": lambda: race_argmax_triton(logits, noise.exponential_(), temperature,
                                                  greedy),
    }
    for got, want in CHECKS:
        if not torch.equal(cases[got](), cases[want]()):
            sys.exit(f"{got} differs from {want} at {rows} rows, {dtype}")
    times = {name: timed_us(fn, flush) for name, fn in cases.items()}
    logit_bytes = rows * vocab * logits.element_size()
    results = []
    for name, us in times.items():
        base = BASES.get(name)
        noise_bytes = rows * vocab * 4 * {"race": 1, "race split": 1,
                                          "draw + race": 2}.get(name, 0)
        results.append({
            "rows": rows, "dtype": str(dtype).split(".")[1], "kernel": name,
            "splits": splits if "split" in name or name == "argmax_triton" else 1,
            "us": round(us, 2),
            "GB/s": round((logit_bytes + noise_bytes) / us / 1e3, 1) if us else None,
            "speed-up": round(times[base] / us, 3) if base and us else None, "base": base})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    results = []
    for dtype in (torch.bfloat16, torch.float32):
        for rows in [int(r) for r in args.rows.split(",")]:
            for row in measure(rows, args.vocab, dtype, flush):
                results.append(row)
                print(f"{rows:>4} {row['dtype']:>8} {row['kernel']:>19} splits "
                      f"{row['splits']:>2} {row['us']:>8.2f} us {row['GB/s']:>7} GB/s"
                      + (f"  x{row['speed-up']} over {row['base']}" if row["speed-up"]
                         else ""), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "vocab": args.vocab,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
