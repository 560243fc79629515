"""Compare workload_kernels.py's JSON files of two trees (k_base_*.json, k_head_*.json in DIR):
output tok/s of each run, and the device time per kernel name (median over runs of each
tree), largest differences first. A one-off diagnostic.

    python3 benchmarks/diagnostics/compare_kernels.py DIR
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys


def read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def main() -> None:
    d = sys.argv[1]
    runs = {kind: [read(p) for p in sorted(glob.glob(os.path.join(d, f"k_{kind}_*.json")))]
            for kind in ("base", "head")}
    for kind, rs in runs.items():
        print(kind, "output tok/s:", [[round(x) for x in r["output_tok_s"]] for r in rs],
              "device total ms:", [round(sum(v[1] for v in r["kernels_us"].values()) / 1e3, 1)
                                   for r in rs])
    names = set()
    for rs in runs.values():
        for r in rs:
            names |= set(r["kernels_us"])
    rows = []
    for n in names:
        med = {kind: statistics.median([r["kernels_us"].get(n, [0, 0.0])[1] for r in rs])
               if rs else 0.0 for kind, rs in runs.items()}
        cnt = {kind: rs[0]["kernels_us"].get(n, [0, 0])[0] if rs else 0
               for kind, rs in runs.items()}
        rows.append((med["head"] - med["base"], n, med, cnt))
    rows.sort(key=lambda r: -abs(r[0]))
    print(f"{'kernel':<70} {'base ms':>8} {'head ms':>8} {'n base':>7} {'n head':>7}")
    for diff, n, med, cnt in rows[:30]:
        print(f"{n[:70]:<70} {med['base'] / 1e3:8.2f} {med['head'] / 1e3:8.2f} "
              f"{cnt['base']:7d} {cnt['head']:7d}")


if __name__ == "__main__":
    main()
