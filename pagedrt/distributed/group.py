"""The tensor-parallel group of one process: its rank, the group's size and the collectives the
sharded layers call (docs/design.md, "Tensor parallelism").

A `TPGroup` is passed to the model when it is built (`pagedrt.models.loader.build_model`); the
layers keep it and call `all_reduce` / `all_gather` on it. Nothing reads a process-wide global:
a model built without one (`SINGLE_RANK`) is the whole model on one device.

Backends: NCCL for CUDA tensors, gloo for CPU tensors (the CI tests run TP on CPU with gloo).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

DIST_TIMEOUT_S = float(os.environ.get("PAGEDRT_DIST_TIMEOUT_S", "300"))
"""Seconds a collective (and forming the group) may wait for the other ranks before it raises
(`PAGEDRT_DIST_TIMEOUT_S`). It bounds a wait on a rank that died where nothing else notices: a
remote rank under torchrun. Worker processes started by the engine are watched by the engine,
which stops every rank within a second of one dying (`pagedrt.distributed.executor`)."""


class ProcessGroupError(ValueError):
    """The tensor-parallel process group could not be formed; the message gives the reason."""


@dataclass(frozen=True, eq=False)
class TPGroup:
    """One rank's view of its tensor-parallel group.

    Attributes:
        rank: this process's rank in [0, size).
        size: number of ranks the model is split over.
        device_group: the torch.distributed group the layers' collectives run on (NCCL on CUDA,
            gloo on CPU); None when size is 1.
    """

    rank: int = 0
    size: int = 1
    device_group: dist.ProcessGroup | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it (a no-op for one rank)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[N, d] on every rank -> [N, size * d]: the ranks' columns side by side, rank order."""
        if self.size == 1:
            return x
        x = x.contiguous()
        out = torch.empty((self.size * x.shape[0], *x.shape[1:]), dtype=x.dtype,
                          device=x.device)  # the ranks' tensors one after the other
        _all_gather_single(out, x, group=self.device_group)
        return out.view(self.size, *x.shape).movedim(0, -2).reshape(
            *x.shape[:-1], self.size * x.shape[-1])


SINGLE_RANK = TPGroup()

# torch 2.13 renamed all_gather_into_tensor (2.11, the GPU machine's, has only the old name)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_tp_group(rank: int, world_size: int, device: torch.device, init_method: str,
                  timeout_s: float = DIST_TIMEOUT_S) -> TPGroup:
    """Join the default torch.distributed group as `rank` of `world_size` and return it as a
    TPGroup; one all-reduce on `device` proves that every rank joined (NCCL forms its
    communicator lazily, so a broken setup would otherwise only fail at the first step).

    Args:
        init_method: torch.distributed's, e.g. "tcp://127.0.0.1:29500", "file:///tmp/x" or
            "env://" (torchrun's MASTER_ADDR and MASTER_PORT).
    Raises:
        ProcessGroupError: the group did not form within `timeout_s` or failed; the message
            has the backend, address, rank and torch's reason.
    """
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        assert int(probe.item()) == world_size, f"all-reduce of ones gave {probe.item()}"
    except Exception as e:  # noqa: BLE001 - any failure here is reported with its reason
        if dist.is_initialized():
            dist.destroy_process_group()
        raise ProcessGroupError(
            f"the tensor-parallel process group ({backend}, {init_method}, rank {rank} of "
            f"{world_size}) failed to form: {type(e).__name__}: {e}") from None
    return TPGroup(rank, world_size, dist.group.WORLD)


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when torchrun (or anything that sets its variables RANK,
    WORLD_SIZE and LOCAL_RANK) started this process as one of several; None otherwise."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return None
    world_size = int(env["WORLD_SIZE"])
    if world_size <= 1:
        return None
    return int(env["RANK"]), world_size, int(env["LOCAL_RANK"])
