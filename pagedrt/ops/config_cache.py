"""Timed config choices kept on disk, so that an engine started again on the same machine,
software and settings takes the choices the first one timed instead of timing every op at every
graph bucket again (pagedrt/ops/config_timing.py, `fastest_config`). On by default, in
`configs/` under pagedrt's cache root (pagedrt/paths.py: $PAGEDRT_CACHE_DIR, default
~/.cache/pagedrt); PAGEDRT_CONFIG_CACHE=<directory> puts it elsewhere, PAGEDRT_CONFIG_CACHE=off
(or 0) times at every start and keeps nothing. docs/design.md, "Small-batch decode", the
paragraph "Timed choices on disk".

A file holds one fingerprint's choices (`fingerprint`: the GPU, torch, Triton, every source
file of the package and every PAGEDRT_* setting but a few that touch no kernel), one JSON line
per (choice table, key): appended by each process as it times (a short line appended to a
local file is written whole, so processes that time side by side, the ranks of tensor
parallelism or test shards, do not garble each other's lines), read back whole at the first
lookup, the last line of a key winning. An unreadable line is skipped with a warning."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import torch

from pagedrt.paths import cache_dir

ENV = "PAGEDRT_CONFIG_CACHE"
OFF_VALUES = ("off", "0")  # PAGEDRT_CONFIG_CACHE values that keep no choices on disk

# the choice tables `fastest_config`'s callers keep, as (module, attributes): their names in
# the files (and in the benchmarks' result files, pagedrt/bench/common.py `kernel_choices`)
CHOICE_TABLES = (("pagedrt.ops.gemv_triton", ("_CHOICE", "_FUSED_CHOICE")),
                 ("pagedrt.ops.matmul_triton", ("_CHOICE",)))

# PAGEDRT_* settings left out of the fingerprint: they change no kernel and no candidate, or
# only a kernel no choice here times or runs beside (PAGEDRT_SAMPLE_SPLIT: the sampler's race
# and argmax), so that A/B runs of such a switch make the same choices and time once
_NOT_FINGERPRINTED = frozenset({ENV, "PAGEDRT_CACHE_DIR", "PAGEDRT_COMMIT",
                                "PAGEDRT_NUM_THREADS", "PAGEDRT_SAMPLE_SPLIT"})

_log = logging.getLogger(__name__)


def table_name(table: dict) -> str | None:
    """"module.ATTRIBUTE" of the choice table `table` is (by identity, as the module holds it
    now: a test that swaps in a fresh table is still found), or None for another dict."""
    for module, attrs in CHOICE_TABLES:
        mod = sys.modules.get(module)
        for attr in attrs:
            if mod is not None and getattr(mod, attr, None) is table:
                return f"{module.rsplit('.', 1)[1]}.{attr}"
    return None


@functools.cache
def _source_digest() -> str:
    """sha256 over every .py file of the pagedrt package (relative path and bytes): any change
    to a kernel, its candidates or the modules whose chains are the baselines retimes."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def fingerprint(device: int, environ: dict | None = None) -> dict:
    """What the choices of CUDA device `device` depend on: the GPU's name, compute capability
    and multiprocessor count, the torch and Triton versions, the package's sources
    (`_source_digest`) and the PAGEDRT_* settings (`environ`, os.environ by default) but those
    in _NOT_FINGERPRINTED."""
    import triton

    environ = os.environ if environ is None else environ
    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "capability": list(torch.cuda.get_device_capability(device)),
            "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "sources": _source_digest(),
            "settings": {k: v for k, v in sorted(environ.items())
                         if k.startswith("PAGEDRT_") and k not in _NOT_FINGERPRINTED}}


def cache_file(directory: str, print_: dict) -> Path:
    """The file of fingerprint `print_` in `directory`: choices-<16 hex digits>.jsonl."""
    digest = hashlib.sha256(json.dumps(print_, sort_keys=True).encode()).hexdigest()[:16]
    return Path(directory) / f"choices-{digest}.jsonl"


def _as_config(value):
    """A config read back from JSON: a list becomes the tuple the ops pass around."""
    return tuple(value) if isinstance(value, list) else value


class ConfigCache:
    """The choices of one file (`cache_file`): `lookup` and `store` by (table name, key).

    Raises (at construction):
        ValueError: `directory` exists and is not a directory; names it and the setting.
    """

    def __init__(self, directory: str, print_: dict):
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise ValueError(f"{directory!r} is a file, not a directory for the timed config "
                             f"choices: set {ENV} to a directory (made if missing) or to 'off'")
        self.path = cache_file(directory, print_)
        self.fingerprint = print_
        self._entries: dict[tuple[str, str], tuple] | None = None
        self._write_failed = False

    def _load(self) -> dict[tuple[str, str], tuple]:
        if self._entries is not None:
            return self._entries
        self._entries = {}
        if self.path.exists():
            for number, line in enumerate(self.path.read_text().splitlines(), 1):
                try:
                    row = json.loads(line)
                    times = {_as_config(c): float(ms) for c, ms in row["times"]}
                    entry = (_as_config(row["config"]), times, int(row["rows"]))
                    self._entries[row["table"], row["key"]] = entry
                except (ValueError, KeyError, TypeError) as e:
                    _log.warning("%s line %d skipped (%s): %.80s", self.path, number, e, line)
        return self._entries

    def lookup(self, table: str, key: tuple) -> tuple | None:
        """(config or None for the baseline, {config or None: ms timed alone}, rows) stored
        for `key` of `table`, or None if this file has none."""
        return self._load().get((table, repr(key)))

    def store(self, table: str, key: tuple, config, times: dict, rows: int) -> None:
        """Keep (config, times, rows) for `key` of `table` here and append it to the file (the
        directory made if missing). A file that cannot be written warns once; the choice
        stays in memory."""
        self._load()[table, repr(key)] = (config, dict(times), rows)
        line = json.dumps({"table": table, "key": repr(key), "rows": rows,
                           "config": None if config is None else list(config),
                           "times": [[None if c is None else list(c), ms]
                                     for c, ms in times.items()]}) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:  # the line in one write(2) at the file's end (O_APPEND), not in buffer-sized parts
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as e:
            if not self._write_failed:
                self._write_failed = True
                _log.warning("timed config choices not saved to %s: %s", self.path, e)


_CACHES: dict[tuple[str, str], ConfigCache] = {}


def cache_directory(environ: dict | None = None) -> str | None:
    """The directory of the timed choices under `environ` (os.environ by default):
    PAGEDRT_CONFIG_CACHE where it names one (a leading ~ expanded), `configs` under pagedrt's
    cache root (`pagedrt.paths.cache_dir`) where it is unset or blank, None where it is one of
    OFF_VALUES (any case)."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV, "").strip()
    if value.lower() in OFF_VALUES:
        return None
    return os.path.expanduser(value) if value else os.path.join(cache_dir(environ), "configs")


def active_cache() -> ConfigCache | None:
    """The current CUDA device's cache in `cache_directory()` (read at each call), or None
    where PAGEDRT_CONFIG_CACHE is off; one object per (directory, fingerprint) per process.

    Raises:
        ValueError: the directory is a file (`ConfigCache`).
    """
    directory = cache_directory()
    if directory is None:
        return None
    print_ = fingerprint(torch.cuda.current_device())
    slot = (directory, json.dumps(print_, sort_keys=True))
    if slot not in _CACHES:
        _CACHES[slot] = ConfigCache(directory, print_)
    return _CACHES[slot]


def cache_for(table: dict) -> tuple[ConfigCache, str] | None:
    """(the `active_cache`, `table`'s name) where PAGEDRT_CONFIG_CACHE is not off and `table`
    is one of CHOICE_TABLES; else None: `fastest_config`'s choice neither read nor kept on
    disk.

    Raises:
        ValueError: the directory is a file (`active_cache`).
    """
    name = table_name(table)
    cache = active_cache() if name is not None else None
    return None if cache is None else (cache, name)


def files_in_use() -> list[str]:
    """The files of the caches `active_cache` has opened in this process, sorted."""
    return sorted(str(cache.path) for cache in _CACHES.values())
