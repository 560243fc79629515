"""The arrival counters' tensor (pagedrt/ops/arrival_counters.py): allocated at first use,
grown outside CUDA graph capture with the old tensor kept alive (a graph may hold its
address), and under capture used where it fits, else a RuntimeError that allocates nothing.
The kernels that count on it are tested with it: tests/test_matmul_triton.py (split-K),
tests/test_sample_split.py (the sampler's split rows)."""

import pytest
import torch

from pagedrt.ops import arrival_counters as ac

CPU = torch.device("cpu")


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(ac, "MIN_COUNTERS", 4)
    monkeypatch.setattr(ac, "_COUNTERS", {})
    monkeypatch.setattr(ac, "_RETIRED", [])


def test_counters_grow_outside_capture_and_raise_inside(fresh, monkeypatch):
    first = ac.arrival_counters("cpu", 3)  # MIN_COUNTERS entries, zeros
    assert first.numel() == 4 and first.dtype == torch.int32 and not first.any()
    assert ac.arrival_counters(CPU, 4) is first
    grown = ac.arrival_counters("cpu", 6)  # the next power of two, the first kept alive
    assert grown.numel() == 8 and ac._RETIRED == [first]
    monkeypatch.setattr(ac, "_capturing", lambda device: True)
    assert ac.arrival_counters("cpu", 8) is grown  # fits: nothing allocated under capture
    with pytest.raises(RuntimeError, match=r"needs 10 arrival counters .* 8 exist .* CUDA graph"):
        ac.arrival_counters("cpu", 10)
    assert ac._COUNTERS[CPU] is grown and ac._RETIRED == [first]


def test_no_capture_on_cpu():
    assert ac._capturing(CPU) is False
