"""GPU checks: every test under tests/gpu/ is marked `gpu` and skips without CUDA
(tests/conftest.py). Run on the H200 with `python3 -m pytest -m gpu tests/gpu`.

Every engine a test builds times its kernel configs at start-up (pagedrt/ops/config_timing.py);
here each config's replay is capped at 2 ms (PAGEDRT_TIMING_REP_MS, unless the caller set it):
the tests check tokens and shapes, not which tile is fastest, and at each op's own 10-20 ms the
engine tests of tiny models spent their whole caps timing. And each engine times for itself:
PAGEDRT_CONFIG_CACHE (choices kept on disk between engines) is off unless a test sets it
(tests/conftest.py)."""

import os

import pytest

TEST_TIMING_REP_MS = "2"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True)
def _short_config_timing(monkeypatch):
    """PAGEDRT_TIMING_REP_MS=2 for the test and the processes it starts (kept if set)."""
    monkeypatch.setenv("PAGEDRT_TIMING_REP_MS",
                       os.environ.get("PAGEDRT_TIMING_REP_MS", TEST_TIMING_REP_MS))
