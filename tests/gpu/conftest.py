"""GPU checks: every test under tests/gpu/ is marked `gpu` and skips without CUDA
(tests/conftest.py). Run on the H200 with `python3 -m pytest -m gpu tests/gpu`."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
