"""Start and stop a real `pagedrt serve` process on 127.0.0.1 for tests (every wait bounded)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(extra_args: list[str], log_path: Path, timeout_s: float = 180,
                 global_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """Launch `pagedrt [global_args] serve` on CPU with `extra_args`; returns (process, base
    URL) once the launcher has printed its "serving" line and /health answers 200. Raises
    AssertionError with the log if it exits or times out."""
    port = free_port()
    cmd = [sys.executable, "-m", "pagedrt.entrypoints.cli", *global_args, "serve", "--host",
           "127.0.0.1", "--port", str(port), "--device", "cpu", *extra_args]
    # one torch thread in the engine core (unless the caller set another): SmolLM2's matmuls
    # at these batch sizes gain nothing from two, and the test process and the API processes
    # share the same few cores (ten times faster on a loaded 2-core machine, 2026-12-01)
    env = {**os.environ, "PAGEDRT_NUM_THREADS": os.environ.get("PAGEDRT_NUM_THREADS", "1")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        # ready: the launcher's "serving" line (printed once every API process accepts)
        if "pagedrt: serving" in log_path.read_text(errors="replace"):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            stop_server(proc)
            raise AssertionError(f"server not healthy after {timeout_s} s:\n"
                                 f"{log_path.read_text()}")
        time.sleep(0.25)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def engine_core_pid(log_path: Path) -> int:
    """The engine-core process id, from the launcher's "serving ..." line."""
    match = re.search(r"engine core pid (\d+)", log_path.read_text())
    assert match, log_path.read_text()
    return int(match.group(1))


def api_pids(log_path: Path) -> list[int]:
    """The API processes' ids, from the launcher's "serving ..." line."""
    match = re.search(r"API pids (\d+(?:,\d+)*)", log_path.read_text())
    assert match, log_path.read_text()
    return [int(p) for p in match.group(1).split(",")]
