"""The KV cache tensors: per layer K and V of shape
[num_blocks, block_size, num_kv_heads, head_dim], plus the CPU pool used for swapping,
and the block copies between them. Built from a `KVCacheSpec`, so that a cache of another
dtype (FP8) or with the KV heads of one tensor-parallel rank changes only the spec
(docs/design.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedrt.config import EngineConfig, ModelConfig
from pagedrt.distributed.sharding import kv_heads_per_rank
from pagedrt.kv.kv_cache_manager import PendingCopies
from pagedrt.ops.attention import copy_blocks


@dataclass(frozen=True)
class KVCacheSpec:
    """The layout of the KV cache of one rank.

    Attributes:
        num_layers: decoder layers (one K and one V tensor each).
        num_kv_heads: KV heads held by this rank.
        head_dim: width of one head.
        block_size: tokens per block.
        dtype: element type of the cache (may differ from the model's).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCacheSpec.{name}={value!r}; it must be an int >= 1")

    @classmethod
    def for_model(cls, model_config: ModelConfig, block_size: int, dtype: torch.dtype,
                  tp_size: int = 1) -> KVCacheSpec:
        """The spec of the cache of one rank of `tp_size` (1: all of the model's KV heads):
        num_key_value_heads / tp_size heads, or one (replicated) when there are more ranks than
        KV heads (pagedrt/distributed/sharding.py)."""
        return cls(model_config.num_hidden_layers,
                   kv_heads_per_rank(model_config.num_key_value_heads, tp_size),
                   model_config.head_dim, block_size, dtype)

    @property
    def block_shape(self) -> tuple[int, int, int]:
        """(block_size, num_kv_heads, head_dim): one block of one layer's K (or V)."""
        return (self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across all layers, K and V:
        2 * num_layers * block_size * num_kv_heads * head_dim * element size."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return (2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim
                * elem)


def kv_bytes_per_block(model_config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block of a single-rank cache of this model (`KVCacheSpec.bytes_per_block`)."""
    return KVCacheSpec.for_model(model_config, block_size, dtype).bytes_per_block


def num_blocks_for_budget(
    spec: KVCacheSpec,
    engine_config: EngineConfig,
    device: torch.device,
    reserved_bytes: int = 0,
) -> int:
    """Number of KV blocks: explicit, or from the CPU byte budget, or on CUDA from
    `gpu_memory_utilization` of the device's total memory minus what is already in use (weights,
    `reserved_bytes` of activations and CUDA-graph workspace).

    Raises:
        ValueError: the budget leaves no room for even one block.
    """
    per_block = spec.bytes_per_block
    if engine_config.num_kv_blocks is not None:
        return engine_config.num_kv_blocks
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * engine_config.gpu_memory_utilization) - used - reserved_bytes
        what = f"gpu_memory_utilization={engine_config.gpu_memory_utilization}"
    else:
        budget = engine_config.kv_cache_memory_bytes  # per rank
        what = f"kv_cache_memory_bytes={engine_config.kv_cache_memory_bytes}"
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(
            f"{what} leaves {budget} bytes for the KV cache, less than one block "
            f"({per_block} bytes); raise it or set num_kv_blocks"
        )
    return int(num_blocks)


class KVCache:
    """Device KV tensors per layer and a (pinned, on CUDA) CPU swap pool of the same layout."""

    def __init__(
        self,
        spec: KVCacheSpec,
        num_blocks: int,
        num_cpu_blocks: int,
        device: torch.device,
        backend: str = "auto",
    ) -> None:
        """K and V of `spec.num_layers` layers, each [num_blocks, *spec.block_shape] of
        `spec.dtype` on `device`, and a CPU pool of `num_cpu_blocks` blocks."""
        self.spec = spec
        shape = (num_blocks, *spec.block_shape)
        n, dtype = spec.num_layers, spec.dtype
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)]
        cpu_shape = (num_cpu_blocks, *shape[1:])
        pin = device.type == "cuda"
        self.cpu_k = [torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(n)]
        self.cpu_v = [torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(n)]
        self.device = device
        self.backend = backend

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.k_caches, self.v_caches))

    def apply(self, pending: PendingCopies) -> None:
        """Perform queued block copies: swap-outs first (their device blocks may be handed out
        again this step), then copy-on-write copies (a copy's source may be a block freed this
        step and reused as a swap-in destination), then swap-ins."""
        if pending.swap_out:
            src = torch.tensor([s for s, _ in pending.swap_out], device=self.device)
            dst = torch.tensor([d for _, d in pending.swap_out])
            for dev, cpu in zip(self.k_caches + self.v_caches, self.cpu_k + self.cpu_v):
                cpu[dst] = dev[src].to("cpu")
        if pending.copy:
            mapping = torch.tensor(pending.copy, dtype=torch.int64, device=self.device)
            copy_blocks(self.k_caches, self.v_caches, mapping, self.backend)
        if pending.swap_in:
            src = torch.tensor([s for s, _ in pending.swap_in])
            dst = torch.tensor([d for _, d in pending.swap_in], device=self.device)
            for dev, cpu in zip(self.k_caches + self.v_caches, self.cpu_k + self.cpu_v):
                dev[dst] = cpu[src].to(self.device, non_blocking=True)
