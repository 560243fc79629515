"""Where pagedrt keeps what it builds on disk: the root of its cache ($PAGEDRT_CACHE_DIR,
default ~/.cache/pagedrt), under which the GGUF loader keeps dequantised weights
(pagedrt/models/loader.py) and the start-up timing keeps its kernel config choices
(pagedrt/ops/config_cache.py)."""

from __future__ import annotations

import os


def cache_dir(environ=None) -> str:
    """Root of pagedrt's on-disk cache: PAGEDRT_CACHE_DIR of `environ` (a mapping, os.environ
    by default) with a leading ~ expanded, or ~/.cache/pagedrt where it is unset or blank."""
    environ = os.environ if environ is None else environ
    value = environ.get("PAGEDRT_CACHE_DIR", "").strip() or os.path.join("~", ".cache", "pagedrt")
    return os.path.expanduser(value)
