"""triton_utils.fastest_config: which errors skip a candidate config and which propagate. The
CUDA timing is replaced by a clock the faked kernels advance, so this runs on CPU."""

from __future__ import annotations

import pytest
import torch
import triton.testing
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from pagedrt.ops import triton_utils

CLOCK: list[float] = []  # device time the faked kernels "ran", per timed replay


@pytest.fixture(params=[True, False], ids=["cold_l2", "warm"])
def fake_timing(monkeypatch, request):
    """do_bench_cudagraph(fn) -> the times the kernels fn ran add to CLOCK; the L2 flush
    takes 10 (cold timing on) or is not run; torch.cuda.synchronize a no-op."""
    def bench(fn, rep):
        CLOCK.clear()
        fn()
        return sum(CLOCK)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", bench)
    monkeypatch.setattr(triton_utils, "COLD_L2_TIMING", request.param)
    monkeypatch.setattr(triton_utils, "_l2_flusher", lambda: lambda: CLOCK.append(10.0))


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
    assert triton_utils.fastest_config(runs(1.0), candidate, ["big", "slow", "fast"],
                                       rep=1) == "fast"


def test_a_clear_win_only(fake_timing):
    candidate = candidate_with({}, {"a": 0.97, "b": 0.96})  # within 5% of the baseline's 1.0
    assert triton_utils.fastest_config(runs(1.0), candidate, ["a", "b"], rep=1) is None


def test_the_flush_time_is_not_counted(fake_timing):
    """A 6% faster kernel wins with and without the flush before each call (with it, the
    totals 11.0 and 10.94 differ by under 1%: the flush's own time must be subtracted)."""
    candidate = candidate_with({}, {"a": 0.94})
    assert triton_utils.fastest_config(runs(1.0), candidate, ["a"], rep=1) == "a"


@pytest.mark.parametrize("error", [
    CompilationError("src", None, "cannot convert None of type <class 'NoneType'> to tensor"),
    RuntimeError("an illegal memory access was encountered"),
])
def test_any_other_error_propagates(fake_timing, error):
    """A kernel that does not compile (or crashes) is a bug, not a config to pass over."""
    candidate = candidate_with({"broken": error}, {"fast": 0.5})
    with pytest.raises(type(error)):
        triton_utils.fastest_config(runs(1.0), candidate, ["fast", "broken"], rep=1)
