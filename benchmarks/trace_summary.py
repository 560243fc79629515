"""Summarize `pagedrt bench throughput` result files: output tok/s, roofline efficiency, the
median decode step (wall and device), and the median host time per phase of the steps at the
largest batch (from the step trace: [wall s, rows, tokens, device ms, {phase: host ms}]).

    python3 benchmarks/trace_summary.py DIR_OR_FILE ...
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys


def summarize(path: str) -> list[str]:
    with open(path) as f:
        data = json.load(f)
    lines = []
    for r in data["results"]:
        if r.get("system") != "pagedrt" or "step_trace" not in r:
            continue
        trace = [row for row in r["step_trace"] if len(row) >= 5]
        top = max((row[1] for row in trace), default=0)
        # decode steps at the largest batch: one token per row
        dec = [row for row in trace if row[1] == top and row[2] == top]
        host = {}
        if dec:
            for phase in dec[0][4]:
                host[phase] = statistics.median(row[4][phase] for row in dec)
        st = r.get("step_times", {})
        lines.append(
            f"{os.path.basename(path)} {r['workload']}: {r['output_tok_s']:,.0f} tok/s, "
            f"eff {100 * r.get('roofline_efficiency', float('nan')):.0f}%, decode step median "
            f"{st.get('decode_step_ms_median', float('nan')):.2f} wall / "
            f"{st.get('decode_model_device_ms_median', float('nan')):.2f} device ms; host per "
            f"{top}-row decode step {sum(host.values()):.2f} ms "
            + " ".join(f"{k} {v:.2f}" for k, v in host.items()))
    return lines


def main() -> None:
    paths = []
    for arg in sys.argv[1:]:
        paths += sorted(glob.glob(os.path.join(arg, "*.json"))) if os.path.isdir(arg) else [arg]
    for path in paths:
        try:
            for line in summarize(path):
                print(line)
        except (KeyError, ValueError, TypeError):
            continue


if __name__ == "__main__":
    main()
