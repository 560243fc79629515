"""Summarize the engine core's timeline ($PAGEDRT_STEP_TRACE=FILE on `pagedrt serve`): the
server's life split into runs at idle gaps, and per run how requests arrived against the steps.

    python3 benchmarks/diagnostics/step_trace.py FILE [--steps N]

Per run: requests added and over how long they arrived, steps until the last prompt was in
(steps with more tokens than sequences carry prefill), the median decode-only step, and the
first N steps (start after the first add, duration, sequences, tokens, requests added by then).
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics


def split_runs(steps: list, adds: list, gap_s: float = 0.5) -> list[tuple[list, list]]:
    """(steps, adds) per run: a run ends where no step ran for `gap_s` seconds."""
    runs, current = [], []
    for step in steps:
        if current and step[0] - current[-1][1] > gap_s:
            runs.append(current)
            current = []
        current.append(step)
    if current:
        runs.append(current)
    out = []
    for run in runs:
        lo, hi = run[0][0] - gap_s, run[-1][1]
        out.append((run, [a for a in adds if lo <= a[0] <= hi]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    with open(args.trace) as f:
        trace = json.load(f)
    for i, (steps, adds) in enumerate(split_runs(trace["steps"], trace["adds"])):
        if not adds:
            continue
        t0 = adds[0][0]
        add_times = [a[0] for a in adds]
        prefill = [s for s in steps if s[3] > s[2]]
        last_prefill_end = max((s[1] for s in prefill), default=t0)
        decode = [1e3 * (s[1] - s[0]) for s in steps if s[3] == s[2] and s[2] > 1]
        print(f"run {i}: {len(adds)} requests over {1e3 * (add_times[-1] - t0):.1f} ms, "
              f"{len(steps)} steps in {steps[-1][1] - t0:.3f} s; prefill steps {len(prefill)}, "
              f"last one ends {1e3 * (last_prefill_end - t0):.1f} ms after the first add; "
              f"decode step median {statistics.median(decode) if decode else 0:.2f} ms")
        for s in steps[:args.steps]:
            added = bisect.bisect_right(add_times, s[0])
            print(f"    +{1e3 * (s[0] - t0):7.1f} ms {1e3 * (s[1] - s[0]):6.2f} ms "
                  f"{s[2]:4d} seqs {s[3]:6d} tokens, {added} added")


if __name__ == "__main__":
    main()
