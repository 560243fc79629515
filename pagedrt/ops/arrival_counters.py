"""Arrival counters: how the kernels whose programs share one result combine it in the same
launch, without a second kernel and without a program waiting for another.

Users: the split-K decode matmuls (`pagedrt/ops/matmul_triton.py`: the programs of one output
tile sum their partial products) and the sampler's split rows (`pagedrt/ops/sample_triton.py`:
the programs of one row keep the best of their spans). The scheme (docs/design.md, "Decode
matmuls (8 to 128 rows)" and "Seeded sampling"):

1. each program stores its partial result to global memory;
2. it counts itself in on the counter of its group (tile or row), `tl.atomic_add(counter, 1)`,
   which returns the count before the add;
3. the program that reads (programs in the group) - 1 arrived last: every other program of the
   group has stored its partial. It reads them, writes the result and sets the counter back
   to 0. The others end. No program waits for another, so nothing depends on which programs
   are resident at once.

Memory ordering: every thread stores its own part of the partials, and Triton issues a scalar
atomic from one thread, so a CTA barrier (`tl.debug_barrier`, bar.sync) first puts all the
CTA's stores before it; the atomic is acq_rel at GPU scope, so it releases them (a release is
cumulative over what the barrier ordered before it) and acquires those of every program that
counted in before (each add is itself acq_rel, so the chain of adds on one counter orders them
all). Triton hands the returned count to the CTA's other threads through shared memory behind
another barrier, which orders their loads after the acquire; the loads use cache modifier .cg
(L2, where the other SMs' stores are), never a line an earlier kernel left in this SM's L1.
tests/test_matmul_codegen.py checks that order in the PTX compiled for sm_90 (st.global,
bar.sync, atom.global.gpu.acq_rel, ld.global.cg), which the CPU interpreter, running one
program at a time, cannot show.

The counters themselves (`arrival_counters`): one persistent zeroed int32 tensor per device,
allocated at first use and never cleared by the host: every launch leaves its counters at 0,
so the next launch and every replay of a CUDA graph start from zero. A graph holds the
tensor's address, so it is never freed nor reallocated while one may hold it: it grows only
outside stream capture, the old tensor kept alive; a captured launch that needs more raises
RuntimeError. Launches on one device share them, so two launches that count must not run at
the same time on two streams of one device (the engine issues its steps on one stream; PDL
overlaps a launch only with the wait at the start of the next kernel, before it touches a
counter; `config_timing.fastest_config` synchronizes around its timing on a stream of its
own).

(The split-K decode attention used the scheme too, its last program per (sequence, KV head)
combining the partitions; it measured slower than the reduce kernel and was removed:
docs/design.md, "Decode attention: measured, not kept".)
"""

from __future__ import annotations

import torch

from pagedrt.ops.triton_utils import next_pow2

MIN_COUNTERS = 65536  # counters the first tensor of a device has room for

# device -> int32 tensor of zeros
_COUNTERS: dict[torch.device, torch.Tensor] = {}
# counter tensors replaced by larger ones, kept alive: a CUDA graph may still hold their address
_RETIRED: list[torch.Tensor] = []


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of `device` is capturing a CUDA graph (False on CPU)."""
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def arrival_counters(device: torch.device | str, needed: int) -> torch.Tensor:
    """The arrival counters on `device` (module doc): one persistent int32 tensor of zeros
    per device with room for at least `needed` counters (a launch's output tiles or rows),
    allocated on first use with max(MIN_COUNTERS, next power of two >= needed) entries and
    cached for the life of the process. Call this before capturing a CUDA graph whose
    launches need more than MIN_COUNTERS (the engine's eager warm-up before each capture does
    it for its own shapes).

    Returns:
        [>= needed] int32 on `device`, all 0 between launches.
    Raises:
        RuntimeError: `needed` exceeds the counters that exist while `device`'s current
            stream is capturing a CUDA graph (a new tensor allocated then would belong to
            the graph's memory pool, and its zero-fill would be captured too).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    counters = _COUNTERS.get(device)
    if counters is not None and counters.numel() >= needed:
        return counters
    have = 0 if counters is None else counters.numel()
    if _capturing(device):
        raise RuntimeError(
            f"a launch needs {needed} arrival counters on {device} (a split-K decode matmul: "
            f"its output tiles; the sampler's split rows: its rows), but {have} exist and they "
            "cannot be allocated while a CUDA graph is being captured (the graph would hold "
            "memory of its own pool). Make a launch of this size eagerly before capturing, or "
            f"call pagedrt.ops.arrival_counters.arrival_counters(device, {needed}) first, or "
            "set PAGEDRT_MATMUL=0 / PAGEDRT_SAMPLE_SPLIT=0.")
    if counters is not None:
        _RETIRED.append(counters)
    counters = torch.zeros(max(MIN_COUNTERS, next_pow2(needed)), dtype=torch.int32,
                           device=device)
    _COUNTERS[device] = counters
    return counters
