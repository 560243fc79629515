"""config_timing.fastest_config: which errors skip a candidate config and which propagate. The
CUDA timing is replaced by a clock the faked kernels advance, so this runs on CPU."""

from __future__ import annotations

import pytest
import torch
import triton.testing
from timing_fakes import fake_bench
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from pagedrt.ops import config_timing

CLOCK: list[float] = []  # device time the faked kernels "ran", per timed replay


@pytest.fixture(params=[True, False], ids=["cold_l2", "warm"])
def fake_timing(monkeypatch, request):
    """do_bench_cudagraph(fn) -> the times the kernels fn ran add to CLOCK; the L2 flush
    takes 10 and the PDL lead kernel 2 (cold timing on), or neither runs;
    torch.cuda.synchronize a no-op."""
    fake_bench(monkeypatch, CLOCK)
    monkeypatch.setattr(config_timing, "COLD_L2_TIMING", request.param)
    monkeypatch.setattr(config_timing, "_l2_flusher", lambda: lambda: CLOCK.append(10.0))
    monkeypatch.setattr(config_timing, "_pdl_lead", lambda: lambda: CLOCK.append(2.0))


def runs(ms: float):
    return lambda: CLOCK.append(ms)


def candidate_with(errors: dict, times: dict):
    def candidate(cfg):
        if cfg in errors:
            raise errors[cfg]
        CLOCK.append(times[cfg])
    return candidate


def test_a_config_out_of_resources_is_skipped(fake_timing):
    candidate = candidate_with({"big": OutOfResources(300_000, 232_448, "shared memory")},
                               {"slow": 1.2, "fast": 0.5})
    assert config_timing.fastest_config(runs(1.0), candidate, ["big", "slow", "fast"],
                                       rep=1) == "fast"


def test_a_clear_win_only(fake_timing):
    candidate = candidate_with({}, {"a": 0.97, "b": 0.96})  # within 5% of the baseline's 1.0
    assert config_timing.fastest_config(runs(1.0), candidate, ["a", "b"], rep=1) is None


def test_the_baseline_margin(fake_timing):
    """baseline_margin sets how clear a win over the baseline must be; between candidates it
    stays 5% (b, 2% faster than a, does not replace it; c, 6% faster, does)."""
    candidate = candidate_with({}, {"a": 0.97, "b": 0.95, "c": 0.91})
    assert config_timing.fastest_config(runs(1.0), candidate, ["a"], rep=1,
                                        baseline_margin=1.0) == "a"
    assert config_timing.fastest_config(runs(1.0), candidate, ["a", "b"], rep=1,
                                        baseline_margin=1.0) == "a"
    assert config_timing.fastest_config(runs(1.0), candidate, ["a", "b", "c"], rep=1,
                                        baseline_margin=1.0) == "c"
    assert config_timing.fastest_config(runs(1.0), candidate, ["a", "b"], rep=1,
                                        baseline_margin=0.9) is None
    slower = candidate_with({}, {"s": 1.03})  # up to 1.05x the baseline's time at 1.05
    assert config_timing.fastest_config(runs(1.0), slower, ["s"], rep=1,
                                        baseline_margin=1.05) == "s"


def test_the_flush_time_is_not_counted(fake_timing):
    """A 6% faster kernel wins with and without the flush and lead before each call (with
    them, the totals 13.0 and 12.94 differ by under 1%: their own time must be subtracted)."""
    candidate = candidate_with({}, {"a": 0.94})
    assert config_timing.fastest_config(runs(1.0), candidate, ["a"], rep=1) == "a"


@pytest.mark.parametrize("error", [
    CompilationError("src", None, "cannot convert None of type <class 'NoneType'> to tensor"),
    RuntimeError("an illegal memory access was encountered"),
])
def test_any_other_error_propagates(fake_timing, error):
    """A kernel that does not compile (or crashes) is a bug, not a config to pass over."""
    candidate = candidate_with({"broken": error}, {"fast": 0.5})
    with pytest.raises(type(error)):
        config_timing.fastest_config(runs(1.0), candidate, ["fast", "broken"], rep=1)


def test_each_timed_call_follows_the_flush_then_the_lead(monkeypatch):
    """With cold timing, every timed replay runs the flush, then the PDL lead, then the
    kernel (the lead must come last: the kernel's programs load their weights while it runs);
    without a lead (PDL off) the flush alone."""
    calls: list[str] = []
    replays: list[list[str]] = []

    def bench(fn, rep):
        calls.clear()
        fn()
        replays.append(list(calls))
        return 1.0
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", bench)
    monkeypatch.setattr(config_timing, "COLD_L2_TIMING", True)
    monkeypatch.setattr(config_timing, "_l2_flusher", lambda: lambda: calls.append("flush"))
    for lead, before in ((lambda: calls.append("lead"), ["flush", "lead"]), (None, ["flush"])):
        replays.clear()
        monkeypatch.setattr(config_timing, "_pdl_lead", lambda lead=lead: lead)
        config_timing.fastest_config(lambda: calls.append("base"),
                                    lambda cfg: calls.append(cfg), ["a"], rep=1)
        assert replays == [before, [*before, "base"], [*before, "a"]], replays


def test_the_lead_kernel_runs_its_fmas():
    """The lead kernel (run here by the interpreter, without PDL) computes what it is asked:
    `iters` steps of x -> 0.999 x + 0.001 per program, stored back."""
    x = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float32)
    expect = x.clone()
    for _ in range(5):
        expect = expect * 0.999 + 0.001
    config_timing._lead_kernel[(3,)](x, 5, PDL=False, num_warps=1)
    torch.testing.assert_close(x, expect)


def test_the_lead_is_opt_in(monkeypatch):
    """Without PAGEDRT_TIMING_LEAD=1 there is no lead kernel (and nothing touches CUDA)."""
    monkeypatch.setattr(config_timing, "TIMING_LEAD", False)
    assert config_timing._pdl_lead() is None


@pytest.mark.parametrize("value, rep, expected", [
    (None, 20, 20), ("", 10, 10), ("2", 20, 2.0), ("2.5", 10, 2.5), ("50", 10, 10)])
def test_timing_rep_is_capped_by_the_environment(value, rep, expected):
    assert config_timing.timing_rep_ms(rep, value) == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", "nan", "2ms"])
def test_a_bad_timing_rep_cap_names_the_value(value):
    with pytest.raises(ValueError, match=f"PAGEDRT_TIMING_REP_MS={value!r}.*positive"):
        config_timing.timing_rep_ms(20, value)


@pytest.mark.parametrize("cap, expected", [(None, [20] * 3), ("2", [2.0] * 3)])
def test_fastest_config_replays_each_config_for_the_capped_time(monkeypatch, cap, expected):
    """Every do_bench_cudagraph call (baseline and each candidate; warm timing) gets the op's
    rep, or PAGEDRT_TIMING_REP_MS where it is lower."""
    reps: list[float] = []
    fake_bench(monkeypatch, CLOCK, reps)
    monkeypatch.setattr(config_timing, "COLD_L2_TIMING", False)
    if cap is None:
        monkeypatch.delenv("PAGEDRT_TIMING_REP_MS", raising=False)
    else:
        monkeypatch.setenv("PAGEDRT_TIMING_REP_MS", cap)
    candidate = candidate_with({}, {"a": 0.5, "b": 0.9})
    assert config_timing.fastest_config(runs(1.0), candidate, ["a", "b"], rep=20) == "a"
    assert reps == expected
