"""PAGEDRT_WARM_SHARD (pagedrt/ops/config_timing.py): a cache-warming process compiles only its
share of each timed choice's configs, times none and takes the baseline."""

import pytest
from triton.runtime.errors import OutOfResources

from pagedrt.ops import config_timing
from pagedrt.ops.config_timing import _warm_only, fastest_config, warm_shard


@pytest.mark.parametrize("value, expected", [(None, None), ("", None), (" ", None),
                                             ("0/8", (0, 8)), ("7/8", (7, 8)),
                                             (" 2/3 ", (2, 3))])
def test_warm_shard_parses(value, expected):
    assert warm_shard(value) == expected


@pytest.mark.parametrize("value", ["8/8", "1", "a/8", "-1/8", "1/0", "1/8/2", "1.5/8"])
def test_warm_shard_rejects_bad_values(value):
    with pytest.raises(ValueError, match="PAGEDRT_WARM_SHARD") as e:
        warm_shard(value)
    assert repr(value.strip()) in str(e.value) and "0 <= i < n" in str(e.value)


def _recorder(fail_on=()):
    calls = []

    def baseline():
        calls.append("baseline")

    def candidate(cfg):
        calls.append(cfg)
        if cfg in fail_on:
            raise OutOfResources(300_000, 232_448, "shared memory")
    return calls, baseline, candidate


@pytest.mark.parametrize("shard, shards", [(0, 1), (0, 3), (1, 3), (2, 3), (5, 8)])
def test_each_shard_compiles_its_share_after_the_baseline(shard, shards):
    configs = [(i, 64) for i in range(7)]
    calls, baseline, candidate = _recorder()
    assert _warm_only(baseline, candidate, iter(configs), shard, shards) is None
    assert calls[0] == "baseline"
    assert calls[1:] == configs[shard::shards]


def test_the_shards_together_compile_every_config_once():
    configs = [(i,) for i in range(11)]
    seen = []
    for shard in range(4):
        calls, baseline, candidate = _recorder()
        _warm_only(baseline, candidate, configs, shard, 4)
        seen += calls[1:]
    assert sorted(seen) == configs


def test_a_config_the_gpu_cannot_run_is_skipped_and_others_still_compile():
    configs = [(1,), (2,), (3,)]
    calls, baseline, candidate = _recorder(fail_on={(2,)})
    assert _warm_only(baseline, candidate, configs, 0, 1) is None
    assert calls == ["baseline", (1,), (2,), (3,)]


def test_fastest_config_under_a_warm_shard_times_nothing(monkeypatch):
    """No CUDA here: the warm path must not reach the timing (do_bench_cudagraph, the L2
    flush), which would fail on this machine."""
    monkeypatch.setattr(config_timing, "WARM_SHARD", (1, 2))
    calls, baseline, candidate = _recorder()
    table, key = {}, ("k", (64, 64), 8)
    assert fastest_config(baseline, candidate, [(1,), (2,), (3,), (4,)], rep=10,
                          record=(table, key, 8)) is None
    assert calls == ["baseline", (2,), (4,)]
