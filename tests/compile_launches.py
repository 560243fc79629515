"""Compiles the kernels of recorded launches (`tests/launch_recorder.py`; under pytest-xdist,
one file per worker beside the named one) for sm_90 with the Triton on the path, no GPU
needed; exits 1 if any fails. `make test` runs it with Triton 3.6, the GPU machines' version,
after the test suite:

    PYTHONPATH=.triton36:$PWD python tests/compile_launches.py .triton36/launches.json

A full run records about a thousand distinct launches; per kernel this compiles the fewest
that cover every constexpr value, argument type and launch option seen (greedy set cover), so
each branch a constexpr selects is compiled at least once, not every combination."""

from __future__ import annotations

import glob
import importlib
import json
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def features(entry: dict) -> set:
    """What one launch exercises: each constexpr value, argument type and option value."""
    out = {("constexpr", k, json.dumps(v, default=repr)) for k, v in entry["constexprs"].items()}
    out |= {("type", k, v) for k, v in entry["types"].items()}
    return out | {("option", k, json.dumps(v)) for k, v in entry["options"].items()}


def covering(entries: list[dict]) -> list[dict]:
    """Per kernel, launches taken largest gain first until every feature of any is covered."""
    by_kernel: dict[tuple, list[dict]] = {}
    for e in entries:
        by_kernel.setdefault((e["module"], e["name"]), []).append(e)
    chosen = []
    for launches in by_kernel.values():
        missing = set().union(*(features(e) for e in launches))
        while missing:
            best = max(launches, key=lambda e: len(features(e) & missing))
            chosen.append(best)
            missing -= features(best)
    return chosen


def compile_sm90(entry: dict):
    """The recorded launch's kernel compiled for sm_90 (constexprs and options as recorded)."""
    os.environ.pop("TRITON_INTERPRET", None)  # (in case a module imported so far set it)
    fn = getattr(importlib.import_module(entry["module"]), entry["name"])
    signature, constexprs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in entry["constexprs"]:
            signature[name] = "constexpr"
            constexprs[(i,)] = entry["constexprs"][name]
        else:
            signature[name] = entry["types"][name]
    source = ASTSource(fn, signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=entry["options"])


def read_recorded(path: str) -> list[dict]:
    """The launches in `path` and in the per-worker files beside it (`path`.gw0, ... under
    pytest-xdist), each distinct launch once."""
    paths = [p for p in [path, *sorted(glob.glob(glob.escape(path) + ".gw*"))]
             if os.path.exists(p)]
    if not paths:
        raise SystemExit(f"no recorded launches at {path} (or {path}.gw*)")
    recorded: dict[str, dict] = {}
    for p in paths:
        with open(p) as f:
            for entry in json.load(f):
                recorded.setdefault(json.dumps(entry, sort_keys=True), entry)
    return list(recorded.values())


def main(path: str) -> int:
    recorded = read_recorded(path)
    unrecorded = [e for e in recorded if "unrecorded" in e]
    for e in unrecorded:  # a launch the recorder could not describe: update launch_recorder.py
        print(f"FAILED to record {e['module']}.{e['name']}: {e['unrecorded']}")
    entries = [e for e in recorded if "unrecorded" not in e]
    chosen = covering(entries)
    kernels = len({(e["module"], e["name"]) for e in entries})
    print(f"triton {triton.__version__}: {len(entries)} launches of {kernels} kernels recorded; "
          f"compiling {len(chosen)} for sm_90")
    start, failed = time.perf_counter(), 0
    for e in chosen:
        try:
            compile_sm90(e)
        except Exception as error:  # noqa: BLE001 - report every kernel that fails
            failed += 1
            print(f"FAILED {e['module']}.{e['name']} {e['constexprs']}: "
                  f"{str(error).strip().splitlines()[-1][:300]}")
    print(f"{len(chosen) - failed} compiled, {failed} failed, "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if failed or unrecorded else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
