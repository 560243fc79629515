"""The kernels compile for sm_90 with Triton 3.6, the GPU machines' version, as well as with
the venv's (3.9): 3.6 rejects some code that 3.9 and its interpreter take (a jit function
returning None in one constexpr branch did: benchmarks/results/RUNS.md, "Runs of 2026-12-04
(11:21-11:52 UTC)"). Compiling needs no GPU: each diagnostic below compiles its kernels with
triton.compile for an sm_90 target. `make test` installs 3.6 under .triton36/ (Makefile)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRITON36 = ROOT / ".triton36"
# matmuls (8-128 rows, with their epilogues), the 1-4-row kernels, decode and extend attention
SCRIPTS = ["matmul_ptx.py", "decode_ptx.py", "extend_ptx.py"]

pytestmark = pytest.mark.skipif(not (TRITON36 / ".installed").exists(),
                                reason="Triton 3.6 not under .triton36/: run `make test`")


@pytest.mark.parametrize("script", SCRIPTS)
def test_kernels_compile_with_triton_3_6(script):
    env = {**os.environ, "PYTHONPATH": f"{TRITON36}{os.pathsep}{ROOT}"}
    env.pop("TRITON_INTERPRET", None)  # compile, not interpret
    version = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"],
                             env=env, capture_output=True, text=True, check=True).stdout
    assert version.startswith("3.6"), version
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/diagnostics" / script)],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
