"""pagedrt.paths.cache_dir: the root of pagedrt's on-disk cache (GGUF conversions, timed
kernel configs) from PAGEDRT_CACHE_DIR."""

from __future__ import annotations

import os

from pagedrt.ops import config_cache
from pagedrt.paths import cache_dir


def test_unset_or_blank_is_the_default_under_home():
    default = os.path.join(os.path.expanduser("~"), ".cache", "pagedrt")
    assert cache_dir({}) == default
    assert cache_dir({"PAGEDRT_CACHE_DIR": ""}) == default  # was '' and a FileNotFoundError
    assert cache_dir({"PAGEDRT_CACHE_DIR": "   "}) == default


def test_a_set_root_is_taken_with_its_tilde_expanded(tmp_path):
    assert cache_dir({"PAGEDRT_CACHE_DIR": str(tmp_path)}) == str(tmp_path)
    assert cache_dir({"PAGEDRT_CACHE_DIR": "~/pc"}) == os.path.join(os.path.expanduser("~"),
                                                                    "pc")
    # the config cache's own setting expands it too
    assert config_cache.cache_directory({"PAGEDRT_CONFIG_CACHE": "~/cfg"}) == os.path.join(
        os.path.expanduser("~"), "cfg")


def test_os_environ_is_read_by_default(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGEDRT_CACHE_DIR", str(tmp_path))
    assert cache_dir() == str(tmp_path)
