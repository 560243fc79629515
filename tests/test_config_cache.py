"""config_cache: timed config choices kept on disk under PAGEDRT_CONFIG_CACHE, and
fastest_config taking them instead of timing. The GPU's properties and the CUDA timing are
faked, so this runs on CPU."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import types

import pytest
import torch
import triton.testing
from timing_fakes import fake_bench

from pagedrt.ops import config_cache, config_timing, gemv_triton, matmul_triton


@pytest.fixture
def fake_gpu(monkeypatch):
    """An "H200" as device 0, and no cache object left from an earlier test."""
    props = types.SimpleNamespace(name="NVIDIA H200", multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(config_cache, "_CACHES", {})
    return props


def test_the_fingerprint_holds_the_gpu_versions_sources_and_kernel_settings(fake_gpu):
    env = {"PAGEDRT_GEMV": "0", "PAGEDRT_COMMIT": "abc1234", "PAGEDRT_CONFIG_CACHE": "/x",
           "PAGEDRT_SAMPLE_SPLIT": "0", "HOME": "/root"}
    fp = config_cache.fingerprint(0, env)
    assert fp["gpu"] == "NVIDIA H200" and fp["sms"] == 132 and fp["capability"] == [9, 0]
    assert fp["torch"] == torch.__version__ and fp["triton"] == triton.__version__
    assert len(fp["sources"]) == 64
    # the commit, the cache itself and the sampler's split (no timed kernel) left out
    assert fp["settings"] == {"PAGEDRT_GEMV": "0"}


def test_a_kernel_setting_or_another_gpu_gets_another_file(fake_gpu, tmp_path):
    base = config_cache.cache_file(str(tmp_path), config_cache.fingerprint(0, {}))
    other_setting = config_cache.fingerprint(0, {"PAGEDRT_MATMUL": "0"})
    assert config_cache.cache_file(str(tmp_path), other_setting) != base
    fake_gpu.name = "NVIDIA H100 80GB HBM3"
    assert config_cache.cache_file(str(tmp_path), config_cache.fingerprint(0, {})) != base
    assert base.name.startswith("choices-") and base.suffix == ".jsonl"


def test_a_choice_stored_by_one_process_is_read_by_the_next(fake_gpu, tmp_path):
    fp = config_cache.fingerprint(0, {})
    first = config_cache.ConfigCache(str(tmp_path / "new_dir"), fp)
    key = (torch.Size([896, 4864]), 16, torch.bfloat16, False, 0)
    cfg = (16, 64, 128, 4, 4, True, 8)
    first.store("matmul_triton._CHOICE", key, cfg, {None: 0.020, cfg: 0.012}, 16)
    first.store("gemv_triton._CHOICE", key, None, {None: 0.010, (4, 512, 4): 0.011}, 1)
    second = config_cache.ConfigCache(str(tmp_path / "new_dir"), fp)
    assert second.lookup("matmul_triton._CHOICE", key) == (cfg, {None: 0.020, cfg: 0.012}, 16)
    assert second.lookup("gemv_triton._CHOICE", key) == (None, {None: 0.010,
                                                                (4, 512, 4): 0.011}, 1)
    assert second.lookup("gemv_triton._FUSED_CHOICE", key) is None
    assert second.lookup("matmul_triton._CHOICE", key[:1] + (32,) + key[2:]) is None


def test_a_bad_line_is_skipped_with_a_warning_and_the_last_line_of_a_key_wins(
        fake_gpu, tmp_path, caplog):
    fp = config_cache.fingerprint(0, {})
    cache = config_cache.ConfigCache(str(tmp_path), fp)
    cache.store("t", ("k",), (1, 2), {None: 1.0, (1, 2): 0.5}, 8)
    with open(cache.path, "a") as f:
        f.write('{"table": "t", "key": "(\'j\',)", "rows": 8, "config": [3]}\n')  # no times
        f.write("not json\n")
    cache.store("t", ("k",), (3, 4), {None: 1.0, (3, 4): 0.4}, 8)
    with caplog.at_level(logging.WARNING, logger="pagedrt.ops.config_cache"):
        again = config_cache.ConfigCache(str(tmp_path), fp)
        assert again.lookup("t", ("k",))[0] == (3, 4)
        assert again.lookup("t", ("j",)) is None
    assert [r.getMessage().split(" skipped")[0][-6:] for r in caplog.records] == [
        "line 2", "line 3"]


def test_a_file_for_a_directory_is_a_value_error(fake_gpu, tmp_path, monkeypatch):
    path = tmp_path / "a_file"
    path.write_text("")
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", str(path))
    with pytest.raises(ValueError, match=f"'{path}' is a file, .* set PAGEDRT_CONFIG_CACHE "
                       "to a directory"):
        config_cache.active_cache()


def test_the_directory_is_under_the_cache_root_unless_set_or_off(fake_gpu, tmp_path):
    root = {"PAGEDRT_CACHE_DIR": str(tmp_path)}
    default = str(tmp_path / "configs")
    assert config_cache.cache_directory(root) == default
    assert config_cache.cache_directory({**root, "PAGEDRT_CONFIG_CACHE": "  "}) == default
    assert config_cache.cache_directory({**root, "PAGEDRT_CONFIG_CACHE": "/x"}) == "/x"
    for off in ("off", "OFF", "0", " off "):
        assert config_cache.cache_directory({**root, "PAGEDRT_CONFIG_CACHE": off}) is None
    # where the cache lives is not what the choices depend on
    assert config_cache.fingerprint(0, root) == config_cache.fingerprint(0, {})


def test_a_file_that_cannot_be_written_warns_once_and_keeps_the_choice(fake_gpu, tmp_path,
                                                                       caplog):
    (tmp_path / "plain").write_text("")
    cache = config_cache.ConfigCache(str(tmp_path / "plain" / "sub"), {"any": 1})
    with caplog.at_level(logging.WARNING, logger="pagedrt.ops.config_cache"):
        cache.store("t", ("a",), (1,), {None: 1.0}, 1)
        cache.store("t", ("b",), None, {None: 1.0}, 1)
    assert len(caplog.records) == 1 and "not saved" in caplog.records[0].getMessage()
    assert cache.lookup("t", ("a",))[0] == (1,) and cache.lookup("t", ("b",))[0] is None


def _append_many(directory: str, writer: int, count: int) -> None:
    cache = config_cache.ConfigCache(directory, {"any": 1})
    for i in range(count):  # every tenth line longer than a write buffer (8 KB)
        configs = {None: 1.0, **{(writer, i, j, 4, 5, True): 0.5 + j
                                 for j in range(400 if i % 10 == 0 else 12)}}
        cache.store("t", (writer, i), (writer, i, 0, 4, 5, True), configs, 8)


def test_processes_appending_side_by_side_lose_no_line(tmp_path):
    """Four processes (as test shards or TP ranks) append 150 choices each to one file at
    once, some lines over 8 KB: every line reads back whole."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, 150)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = config_cache.ConfigCache(str(tmp_path), {"any": 1})
    lines = cache.path.read_text().splitlines()
    assert len(lines) == 600 and all(json.loads(line)["table"] == "t" for line in lines)
    assert all(cache.lookup("t", (w, i))[0] == (w, i, 0, 4, 5, True)
               for w in range(4) for i in range(150))


def test_table_names_follow_the_modules_tables(monkeypatch):
    fresh = {}
    monkeypatch.setattr(gemv_triton, "_FUSED_CHOICE", fresh)
    assert config_cache.table_name(fresh) == "gemv_triton._FUSED_CHOICE"
    assert config_cache.table_name(matmul_triton._CHOICE) == "matmul_triton._CHOICE"
    assert config_cache.table_name({}) is None


@pytest.fixture
def fake_timing(monkeypatch):
    """do_bench_cudagraph(fn) -> what the faked kernels fn ran report; warm timing; counts of
    the kernels run, by name."""
    runs: list[str] = []
    clock: list[float] = []
    fake_bench(monkeypatch, clock)
    monkeypatch.setattr(config_timing, "COLD_L2_TIMING", False)
    monkeypatch.setattr(config_timing, "TIMED", {})

    def kernel(name, ms):
        def run(*_):
            runs.append(name)
            clock.append(ms)
        return run
    return runs, kernel


def test_fastest_config_takes_an_earlier_processes_choice_without_timing(
        fake_gpu, fake_timing, tmp_path, monkeypatch):
    runs, kernel = fake_timing
    table = {}
    monkeypatch.setattr(matmul_triton, "_CHOICE", table)
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", str(tmp_path))
    key = (torch.Size([1152, 896]), 32, torch.bfloat16, True, 0)
    times = {(1,): 0.5, (2,): 0.8}

    def candidate(cfg):
        kernel(f"cfg{cfg}", times[cfg])()
    chosen = config_timing.fastest_config(kernel("baseline", 1.0), candidate, [(1,), (2,)],
                                          rep=10, record=(table, key, 32))
    assert chosen == (1,) and runs  # timed here: the first process
    assert len(list(tmp_path.iterdir())) == 1
    # the next process: fresh cache objects and TIMED, nothing run
    monkeypatch.setattr(config_cache, "_CACHES", {})
    monkeypatch.setattr(config_timing, "TIMED", {})
    runs.clear()
    again = config_timing.fastest_config(kernel("baseline", 1.0), candidate, [(1,), (2,)],
                                         rep=10, record=(table, key, 32))
    assert again == (1,) and runs == []
    assert config_timing.TIMED[id(table), key] == (table, 32, {None: 1.0, (1,): 0.5,
                                                               (2,): 0.8})
    # another setting: another file, timed again
    monkeypatch.setenv("PAGEDRT_MATMUL_FUSED_MAX_ROWS", "256")
    assert config_timing.fastest_config(kernel("baseline", 1.0), candidate, [(1,), (2,)],
                                        rep=10, record=(table, key, 32)) == (1,)
    assert runs and len(list(tmp_path.iterdir())) == 2


def test_by_default_a_timed_choice_is_kept_under_the_cache_root(fake_gpu, fake_timing,
                                                                tmp_path, monkeypatch):
    _, kernel = fake_timing
    monkeypatch.setenv("PAGEDRT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PAGEDRT_CONFIG_CACHE")  # tests/conftest.py had it off
    table = {}
    monkeypatch.setattr(gemv_triton, "_CHOICE", table)
    config_timing.fastest_config(kernel("baseline", 1.0), kernel("cfg", 0.5), [(1,)], rep=10,
                                 record=(table, ("k",), 1))
    files = list((tmp_path / "configs").iterdir())
    assert len(files) == 1 and json.loads(files[0].read_text())["config"] == [1]


def test_off_or_without_a_record_nothing_is_kept(fake_gpu, fake_timing, tmp_path,
                                                 monkeypatch):
    _, kernel = fake_timing
    monkeypatch.setenv("PAGEDRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", "off")
    table = {}
    monkeypatch.setattr(gemv_triton, "_CHOICE", table)
    config_timing.fastest_config(kernel("baseline", 1.0), kernel("cfg", 0.5), [(1,)], rep=10,
                                 record=(table, ("k",), 1))
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", str(tmp_path))
    config_timing.fastest_config(kernel("baseline", 1.0), kernel("cfg", 0.5), [(1,)], rep=10)
    config_timing.fastest_config(kernel("baseline", 1.0), kernel("cfg", 0.5), [(1,)], rep=10,
                                 record=({}, ("k",), 1))  # a table no module holds
    assert list(tmp_path.iterdir()) == []


def test_a_warm_shard_neither_reads_nor_writes_the_file(fake_gpu, fake_timing, tmp_path,
                                                        monkeypatch):
    runs, kernel = fake_timing
    table = {}
    monkeypatch.setattr(gemv_triton, "_CHOICE", table)
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", str(tmp_path))
    cache = config_cache.active_cache()
    cache.store("gemv_triton._CHOICE", ("k",), (1,), {None: 1.0, (1,): 0.5}, 1)
    monkeypatch.setattr(config_timing, "WARM_SHARD", (0, 1))
    lines = cache.path.read_text()
    assert config_timing.fastest_config(kernel("baseline", 1.0), kernel("cfg", 0.5), [(1,)],
                                        rep=10, record=(table, ("k",), 1)) is None
    assert runs == ["baseline", "cfg"]  # compiled both, as warming must
    assert cache.path.read_text() == lines


def test_the_totals_count_timed_and_read_choices_and_nested_seconds_once(
        fake_gpu, fake_timing, tmp_path, monkeypatch):
    """Two choices timed (one inside the other's baseline: its seconds counted once, in the
    outer's), then read back by a fresh process: the totals say so, and the start-up line of
    `pagedrt bench throughput` prints them."""
    from pagedrt.bench.common import format_start_up

    _, kernel = fake_timing
    monkeypatch.setattr(config_timing, "TOTALS", config_timing.TimingTotals())
    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", str(tmp_path))
    plain, fused = {}, {}
    monkeypatch.setattr(gemv_triton, "_CHOICE", plain)
    monkeypatch.setattr(gemv_triton, "_FUSED_CHOICE", fused)
    clock = iter(range(100))
    monkeypatch.setattr(config_timing, "time",
                        types.SimpleNamespace(perf_counter=lambda: float(next(clock))))

    def unfused():  # the fused op's baseline runs the plain op, whose choice it times
        if ("plain",) not in plain:
            plain["plain",] = config_timing.fastest_config(
                kernel("plain", 1.0), lambda cfg: kernel("tile", 0.5)(), [(1,), (2,)], rep=10,
                record=(plain, ("plain",), 1))
        kernel("unfused", 1.0)()

    def choose():
        return config_timing.fastest_config(unfused, lambda cfg: kernel("fused", 0.4)(),
                                            [(7,)], rep=10, record=(fused, ("fused",), 1))
    assert choose() == (7,)
    totals = config_timing.TOTALS
    assert (totals.choices_timed, totals.configs_timed, totals.choices_read) == (2, 5, 0)
    # the clock ticks once a reading: the outer call read 0 going in, the inner 1 going in
    # (and nothing going out: not counted), the outer 2 going out
    assert totals.seconds == 2.0
    monkeypatch.setattr(config_cache, "_CACHES", {})
    plain.clear()
    assert choose() == (7,) and totals.choices_read == 1 and totals.choices_timed == 2
    line = format_start_up({"engine_s": 61.04, "gemm_warm_up_s": 2.0, "graph_capture_s": 50.0,
                            "config_timing": dataclasses.asdict(totals)})
    assert line == ("pagedrt start-up: engine 61.0 s (GEMM warm-up 2.0 s, graph capture 50.0"
                    " s); kernel configs: 2 choices timed (5 configs) in 2.0 s, 1 read from the "
                    "config cache")


def test_results_files_name_the_choice_files_looked_up(fake_gpu, tmp_path, monkeypatch):
    """`pagedrt bench` results name the files this process's timing looked up, or None: the
    setting alone (as on a CPU, where nothing is timed) names none."""
    from pagedrt.bench.common import config_cache_files

    monkeypatch.setenv("PAGEDRT_CONFIG_CACHE", str(tmp_path))
    assert config_cache_files() is None
    cache = config_cache.active_cache()
    assert config_cache_files() == [str(cache.path)]
