"""Host staging buffers for a step's copies between host and device (docs/design.md, "Host
work per step").

With async scheduling one step is in flight while the next is prepared, so a step's host
buffer must not be refilled before that step's copy has run: `StepBuffers` keeps two int64
buffers and hands them out in turn, one per step. The one a step used is free again once
that step has been fetched (its event waited on), before the step after next takes it.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host values (a list, a numpy array or a CPU tensor) as a tensor on `device` without a
    host sync: on CUDA through pinned memory, non-blocking (a copy from pageable memory, such
    as `torch.tensor(..., device="cuda")`, waits for the stream). `dtype`: the tensor's dtype
    (None: the values' own, float32 for Python floats). On the CPU the host tensor itself,
    which may share memory with `values`."""
    if isinstance(values, torch.Tensor):
        host = values if dtype is None else values.to(dtype)
    elif isinstance(values, np.ndarray):
        host = torch.from_numpy(np.ascontiguousarray(values))
        host = host if dtype is None else host.to(dtype)
    else:
        host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class StepBuffers:
    """Two int64 host buffers used in turn, one per step, cut into slices as the step asks.

    Allocated up front and grown only past their size (to twice what a step asked): pinning
    memory (cudaHostAlloc) later could wait for the device and stall the pipeline. `pin`:
    page-locked memory (CUDA; a copy from pageable memory waits for the stream); without it
    plain memory, so that the CPU runs the same path.
    """

    def __init__(self, size: int, pin: bool = True) -> None:
        self.pin = pin
        self.buffers = [torch.empty(size, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.turn = 0
        self.used = 0

    def next_step(self) -> None:
        """Move to the other buffer, from its start."""
        self.turn ^= 1
        self.used = 0

    def take(self, n: int) -> torch.Tensor:
        """The next n int64 elements of this step's buffer ([n] view). A buffer too small is
        replaced by one twice the step's need (slices already handed out keep the old one)."""
        buffer = self.buffers[self.turn]
        if self.used + n > buffer.numel():
            buffer = self.buffers[self.turn] = torch.empty(
                2 * (self.used + n), dtype=torch.int64, pin_memory=self.pin)
            self.used = 0
        self.used += n
        return buffer[self.used - n: self.used]

    def _stage(self, flat: np.ndarray) -> torch.Tensor:
        """`flat` ([n] int64) written into the next step's buffer; returns that slice."""
        self.next_step()
        staged = self.take(len(flat))
        staged.numpy()[:] = flat
        return staged

    def to_device(self, flat: np.ndarray, device: torch.device) -> torch.Tensor:
        """A step's one host-to-device copy: `flat` ([n] int64) staged in the next buffer and
        copied to `device` without waiting for it."""
        return self._stage(flat).to(device, non_blocking=True)

    def copy_into(self, flat: np.ndarray, out: torch.Tensor) -> torch.Tensor:
        """`to_device` into the first len(flat) elements of `out` (a device buffer of int64
        whose address must not change, such as a CUDA graph's input); returns that slice."""
        dst = out[: len(flat)]
        dst.copy_(self._stage(flat), non_blocking=True)
        return dst
