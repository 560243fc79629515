"""StepClock: where a step's time goes (schedule, prepare, forward, sample, update).

Off by default: marks only read the wall clock, so phase times overlap with queued GPU work.
With `enabled = True` every mark first synchronizes the device, which gives honest per-phase
times at the cost of a sync per phase (benchmarks run a separate pass for this).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


class StepClock:
    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.enabled = False
        self.totals: dict[str, float] = defaultdict(float)  # seconds per phase, all steps
        self._t0 = self._last = 0.0

    def start(self) -> StepClock:
        self._t0 = self._last = time.perf_counter()
        return self

    def mark(self, phase: str) -> None:
        if self.enabled and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.totals[phase] += now - self._last
        self._last = now

    def total(self) -> float:
        return time.perf_counter() - self._t0

    def reset(self) -> None:
        self.totals.clear()


class _NullClock:
    def mark(self, phase: str) -> None:
        pass


NULL_CLOCK = _NullClock()
