"""The KV cache tensors: per layer K and V of shape
[num_blocks, block_size, num_kv_heads, head_dim], plus the CPU pool used for swapping,
and the block copies between them."""

from __future__ import annotations

import torch

from pagedrt.config import EngineConfig, ModelConfig
from pagedrt.kv.kv_cache_manager import PendingCopies
from pagedrt.ops.attention import copy_blocks


def kv_bytes_per_block(model_config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers, K and V: 2 * layers * block_size * kv_heads * d."""
    elem = torch.empty((), dtype=dtype).element_size()
    return (2 * model_config.num_hidden_layers * block_size * model_config.num_key_value_heads
            * model_config.head_dim * elem)


def num_blocks_for_budget(
    model_config: ModelConfig,
    engine_config: EngineConfig,
    dtype: torch.dtype,
    device: torch.device,
    reserved_bytes: int = 0,
) -> int:
    """Number of KV blocks: explicit, or from the CPU byte budget, or on CUDA from
    `gpu_memory_utilization` of the device's total memory minus what is already in use (weights,
    `reserved_bytes` of activations and CUDA-graph workspace).

    Raises:
        ValueError: the budget leaves no room for even one block.
    """
    per_block = kv_bytes_per_block(model_config, engine_config.block_size, dtype)
    if engine_config.num_kv_blocks is not None:
        return engine_config.num_kv_blocks
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * engine_config.gpu_memory_utilization) - used - reserved_bytes
        what = f"gpu_memory_utilization={engine_config.gpu_memory_utilization}"
    else:
        budget = engine_config.kv_cache_memory_bytes
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
        model_config: ModelConfig,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int,
        dtype: torch.dtype,
        device: torch.device,
        backend: str = "auto",
    ) -> None:
        shape = (num_blocks, block_size, model_config.num_key_value_heads, model_config.head_dim)
        n = model_config.num_hidden_layers
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
