"""Recompute the roofline efficiency of recorded `pagedrt bench throughput` results with the
honest floor of `pagedrt/bench/roofline.py` (the formula is in its docstring), from each file's
own measured ceilings, workload and elapsed time; no GPU needed.

    python3 benchmarks/recompute_roofline.py FILE.json [FILE.json ...]

Prints, per pagedrt row: workload, output tok/s, the efficiency the file recorded (the formula
of its day) and the honest one, with the floor, the looser bound and the steps bound by compute.
The model comes from the workload's preset name (a "-v<N>" suffix, as in the served folder
"qwen2-0.5b-v49152-random", sets the vocabulary).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

from pagedrt.bench.presets import get_preset
from pagedrt.bench.roofline import RooflineModel, roofline_floor
from pagedrt.bench.throughput import make_workload


def model_for(name: str):
    """The preset of a workload's model name ("qwen2-0.5b", "qwen2-0.5b-v49152-random")."""
    match = re.match(r"(.+?)-v(\d+)(?:-random)?$", name)
    if match:
        return dataclasses.replace(get_preset(match.group(1)), vocab_size=int(match.group(2)))
    return get_preset(name)


def lengths(workload: str) -> tuple[list[int], list[int]]:
    """(prompt lengths, output lengths) of a recorded workload ("256x512x128", "nanovllm")."""
    if workload == "nanovllm":
        prompts, params, _ = make_workload(argparse.Namespace(workload="nanovllm"))
        return [len(p) for p in prompts], [p.max_tokens for p in params]
    n, i, o = (int(x) for x in workload.split("x"))
    return [i] * n, [o] * n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    print(f"{'file':34s} {'workload':32s} {'tok/s':>8s} {'recorded':>8s} {'honest':>7s} "
          f"{'floor s':>8s} {'bound s':>8s} {'compute steps':>13s}")
    for path in args.files:
        with open(path) as f:
            doc = json.load(f)
        ceilings = doc.get("ceilings")
        if not ceilings:
            continue
        for r in doc["results"]:
            if r.get("system") != "pagedrt" or "elapsed_s" not in r:
                continue
            model_name, workload = r["workload"].split(" ", 1)
            prompt_lens, output_lens = lengths(workload)
            model = RooflineModel.from_config(model_for(model_name))
            floor = roofline_floor(model, prompt_lens, output_lens, ceilings, 2)
            recorded = r.get("roofline_efficiency")
            print(f"{path.split('/')[-1][:34]:34s} {r['workload'][:32]:32s} "
                  f"{r['output_tok_s']:8,.0f} "
                  f"{'-' if recorded is None else format(recorded, '.0%'):>8s} "
                  f"{floor['floor_s'] / r['elapsed_s']:7.0%} {floor['floor_s']:8.4f} "
                  f"{floor['bound_s']:8.4f} {floor['compute_bound_steps']:>6d} / "
                  f"{floor['steps']:<5d}")


if __name__ == "__main__":
    main()
