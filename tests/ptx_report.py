"""Run a compile-for-sm_90 diagnostic of benchmarks/diagnostics/ (decode_ptx.py, matmul_ptx.py)
in a subprocess without TRITON_INTERPRET and return its JSON report; skips the test where this
triton has no NVIDIA backend to compile with."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ptx_report(script: str) -> dict:
    """The last stdout line of `benchmarks/diagnostics/<script> --json`, parsed."""
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this triton has no NVIDIA backend to compile for sm_90 with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/diagnostics" / script),
                          "--json"], check=False, capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
