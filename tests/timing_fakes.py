"""A stand-in for the CUDA timing of config_timing.fastest_config, so its tests run on CPU."""

from __future__ import annotations

import torch
import triton.testing


def fake_bench(monkeypatch, clock: list[float], reps: list | None = None) -> None:
    """do_bench_cudagraph(fn, rep) -> the sum of the ms that the faked kernels fn runs append
    to `clock` (cleared first), each call's `rep` appended to `reps` where given;
    torch.cuda.synchronize a no-op."""
    def bench(fn, rep):
        if reps is not None:
            reps.append(rep)
        clock.clear()
        fn()
        return sum(clock)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", bench)
