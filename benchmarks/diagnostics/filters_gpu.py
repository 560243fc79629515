"""Device time of the batched sampler's top-k/top-p filter at Qwen2's vocabulary: the selection
path (`topk` candidates where a row has a top-k, a sort for rows with top-p alone) against
sorting every row, for batches of each kind, checked equal first. A diagnostic for issue 16
("with every sampling setting"), not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/filters_gpu.py [--rows 256] [--out F.json]
"""

from __future__ import annotations

import argparse
import functools
import json

import numpy as np
import torch
import triton

from pagedrt.engine.logits_processors import _top_k_top_p_sorted, apply_top_k_top_p

VOCAB = 151936
BATCHES = {  # name: (k, p) per row, in turn
    "filters (k 20, p 0.9)": [(20, 0.9)],
    "top-k 50 alone": [(50, 1.0)],
    "top-k 1024, p 0.95": [(1024, 0.95)],
    "top-p 0.9 alone": [(VOCAB, 0.9)],
    "mixed: k 20 p 0.9 / p 0.95 alone / none": [(20, 0.9), (VOCAB, 0.95), (VOCAB, 1.0)],
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(args.rows, VOCAB, device="cuda", generator=g) * 4
    results = []
    for name, kinds in BATCHES.items():
        host_k = np.array([kinds[i % len(kinds)][0] for i in range(args.rows)])
        host_p = np.array([kinds[i % len(kinds)][1] for i in range(args.rows)], dtype=np.float32)
        k = torch.tensor(host_k, device="cuda")[:, None]
        pp = torch.tensor(host_p, device="cuda")[:, None]
        got = apply_top_k_top_p(logits, k, pp, host_k, host_p)
        want = _top_k_top_p_sorted(logits, k, pp)
        same = bool(torch.equal(got.isfinite(), want.isfinite()))
        ms_sel = triton.testing.do_bench(
            functools.partial(apply_top_k_top_p, logits, k, pp, host_k, host_p))
        ms_sort = triton.testing.do_bench(functools.partial(_top_k_top_p_sorted, logits, k, pp))
        results.append({"batch": name, "rows": args.rows, "selection_ms": ms_sel,
                        "sort_ms": ms_sort, "same_kept_sets": same})
        print(f"{name:42s} selection {ms_sel:7.3f} ms  sort {ms_sort:7.3f} ms  "
              f"same kept sets: {same}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
