"""The KV cache tensors: per layer K and V of shape
[num_blocks, block_size, num_kv_heads, head_dim], plus the CPU pool used for swapping,
and the block copies between them. Built from a `KVCacheSpec`, so that a cache of another
dtype (FP8) or with the KV heads of one tensor-parallel rank changes only the spec
(docs/design.md).

An FP8 cache (`kv_cache_dtype="fp8"`) holds float8_e4m3fn K and V and, per layer, their
scales [num_blocks, num_kv_heads, block_size] float32 (`pagedrt.ops.fp8`). Scales are indexed
by block like K and V, so everything that moves a block (copy-on-write, swap out and in) moves
its scales with it, and a prefix-cached block keeps them. Its V is stored dim-major
([num_blocks, num_kv_heads, head_dim, block_size], `KVCacheSpec.v_dim_major`; not for models
with sliding-window layers, nor with PAGEDRT_FP8_V_DIM_MAJOR=0) and handed out as a view with
the usual shape: kernels take V's strides, and a block is still one contiguous run, so block
copies move it whole. The decode kernel reads it faster (docs/design.md, "FP8 KV cache").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from pagedrt.config import KV_CACHE_DTYPES, EngineConfig, ModelConfig
from pagedrt.distributed.sharding import kv_heads_per_rank
from pagedrt.env_flags import env_flag
from pagedrt.kv.kv_cache_manager import PendingCopies
from pagedrt.ops.attention import KVCacheLayer, copy_blocks, triton_available
from pagedrt.ops.fp8 import FP8_DTYPE, SCALE_DTYPE, is_fp8

FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: Triton's float8e4nv (fp8 e4m3) needs sm_89+


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The element type for `EngineConfig.kv_cache_dtype`, not checked against a device:
    "auto" is `model_dtype`, "fp8" float8_e4m3fn.

    Raises:
        ValueError: an unknown kv_cache_dtype.
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported; use one of "
                         f"{KV_CACHE_DTYPES} ('auto' = the model's dtype, 'fp8' = float8 e4m3 "
                         "with a scale per token and KV head)")
    return model_dtype if kv_cache_dtype == "auto" else FP8_DTYPE


def resolve_kv_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype,
                           device: torch.device, backend: str) -> torch.dtype:
    """The element type of the cache for `EngineConfig.kv_cache_dtype`: "auto" is the model's
    dtype, "fp8" float8_e4m3fn (the model still computes in `model_dtype`).

    Raises:
        ValueError: an unknown kv_cache_dtype, or "fp8" where the attention backend cannot
            read it (the Triton kernels on a CUDA GPU older than compute capability 8.9).
    """
    dtype = kv_cache_torch_dtype(kv_cache_dtype, model_dtype)
    if dtype == model_dtype:
        return dtype
    triton_kernels = backend == "triton" or (backend == "auto" and triton_available())
    if device.type == "cuda" and triton_kernels:
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            raise ValueError(
                f"kv_cache_dtype='fp8' with attention_backend={backend!r}: the Triton kernels "
                f"need fp8 (e4m3) support, compute capability >= 8.9 (Ada, Hopper or newer); "
                f"{name} is {capability[0]}.{capability[1]}. Supported here: "
                "kv_cache_dtype='auto', or 'fp8' with attention_backend='torch'")
    return FP8_DTYPE


def fp8_v_dim_major_requested(sliding_window: bool = False) -> bool:
    """Whether an FP8 cache's V is stored dim-major (`KVCacheSpec.v_dim_major`):
    PAGEDRT_FP8_V_DIM_MAJOR=1 or 0 decides; unset, yes unless the model has sliding-window
    layers (`sliding_window`), whose decode tiles start unaligned, so the kernel would read
    such V byte by byte (docs/design.md, "FP8 KV cache")."""
    env = env_flag("PAGEDRT_FP8_V_DIM_MAJOR")
    return not sliding_window if env is None else env


@dataclass(frozen=True)
class KVCacheSpec:
    """The layout of the KV cache of one rank.

    Attributes:
        num_layers: decoder layers (one K and one V tensor each).
        num_kv_heads: KV heads held by this rank.
        head_dim: width of one head.
        block_size: tokens per block.
        dtype: element type of the cache (may differ from the model's): float8_e4m3fn makes
            an FP8 cache, with float32 scales per token and KV head beside K and V.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    fp8_v_dim_major: bool = field(default_factory=fp8_v_dim_major_requested)

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
                   model_config.head_dim, block_size, dtype,
                   fp8_v_dim_major_requested(model_config.sliding_window is not None))

    @property
    def block_shape(self) -> tuple[int, int, int]:
        """(block_size, num_kv_heads, head_dim): one block of one layer's K (or V)."""
        return (self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def is_fp8(self) -> bool:
        """Whether K and V are float8_e4m3fn with scales beside them."""
        return is_fp8(self.dtype)

    @property
    def v_dim_major(self) -> bool:
        """Whether V is stored [num_blocks, num_kv_heads, head_dim, block_size] (tokens
        contiguous) and handed out as a view with the usual logical shape: an FP8 cache's V,
        unless the model has sliding-window layers or PAGEDRT_FP8_V_DIM_MAJOR=0
        (`fp8_v_dim_major_requested`, read when the spec is made). The decode kernel then
        reads V along tokens: 230 us against 262 us with V in K's layout on the H200
        (Llama-3-8B heads, B64 L4096; docs/design.md, "FP8 KV cache")."""
        return self.is_fp8 and self.fp8_v_dim_major

    @property
    def scales_shape(self) -> tuple[int, int]:
        """(num_kv_heads, block_size): one block of one layer's K (or V) scales (FP8)."""
        return (self.num_kv_heads, self.block_size)

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token across all layers, K and V: 2 * num_layers * num_kv_heads *
        (head_dim * element size, plus a 4-byte scale in an FP8 cache)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        per_head = self.head_dim * elem
        if self.is_fp8:
            per_head += torch.empty((), dtype=SCALE_DTYPE).element_size()
        return 2 * self.num_layers * self.num_kv_heads * per_head

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across all layers, K and V (and an FP8 cache's scales):
        block_size * bytes_per_token."""
        return self.block_size * self.bytes_per_token

    @property
    def dtype_name(self) -> str:
        """The cache's element type as stats and /metrics show it ("bfloat16", "fp8_e4m3")."""
        return "fp8_e4m3" if self.is_fp8 else str(self.dtype).removeprefix("torch.")


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
    others = ""
    if device.type == "cuda":
        budget, others = _cuda_budget(engine_config.gpu_memory_utilization, device,
                                      reserved_bytes, per_block)
        what = f"gpu_memory_utilization={engine_config.gpu_memory_utilization}"
    else:
        budget = engine_config.kv_cache_memory_bytes  # per rank
        what = f"kv_cache_memory_bytes={engine_config.kv_cache_memory_bytes}"
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(
            f"{what} leaves {budget} bytes for the KV cache, less than one block "
            f"({per_block} bytes){others}; raise it or set num_kv_blocks"
        )
    return int(num_blocks)


RELEASE_WAIT_S = 10.0  # how long sizing waits for memory that other processes are giving back


def _cuda_budget(utilization: float, device: torch.device, reserved_bytes: int,
                 per_block: int) -> tuple[int, str]:
    """(bytes left for the KV cache on `device`, a note on other processes' memory).

    The device's used memory counts every process. A process that has just exited (the
    worker of an engine shut down a moment ago, in the previous command of a script) may
    still be giving its memory back: when the budget is below one block and other processes
    hold memory, wait up to RELEASE_WAIT_S for it before giving up."""
    deadline = time.monotonic() + RELEASE_WAIT_S
    while True:
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * utilization) - used - reserved_bytes
        others = used - torch.cuda.memory_reserved(device)
        if budget >= per_block or others <= per_block or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    note = ""
    if others > per_block:
        note = (f", other processes hold about {others} bytes of this GPU (nvidia-smi lists "
                f"them; an engine's worker processes are stopped by llm.llm_engine.shutdown())")
    return budget, note


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors are moved as uint8 (index copies need no fp8 kernels that way)."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


class KVCache:
    """Device KV tensors per layer (and an FP8 cache's scales) and a (pinned, on CUDA) CPU
    swap pool of the same layout."""

    def __init__(
        self,
        spec: KVCacheSpec,
        num_blocks: int,
        num_cpu_blocks: int,
        device: torch.device,
        backend: str = "auto",
    ) -> None:
        """K and V of `spec.num_layers` layers, each [num_blocks, *spec.block_shape] of
        `spec.dtype` on `device` (with an FP8 spec, scales [num_blocks, *spec.scales_shape]
        float32 each), and a CPU pool of `num_cpu_blocks` blocks.

        The layers' K and V tensors are views of one [2, num_layers, num_blocks, block_numel]
        tensor (K then V; scales alike, [2, num_layers, num_blocks, ...]), so that a block copy
        in every layer is one gather and one scatter (`gather_copy_blocks`), whatever V's
        layout (`KVCacheSpec.v_dim_major`)."""
        self.spec = spec
        n, dtype = spec.num_layers, spec.dtype
        pin = device.type == "cuda"

        def tensors(shape, dtype, count, **where) -> list[torch.Tensor]:
            return [torch.zeros(shape, dtype=dtype, **where) for _ in range(count)]

        # K then V, every block of every layer one contiguous run of block_numel elements
        bs, heads, dim = spec.block_shape
        self.kv_all = torch.zeros((2, n, num_blocks, bs * heads * dim), dtype=dtype,
                                  device=device)
        self.k_all = self.kv_all[0].view(n, num_blocks, *spec.block_shape)
        self.k_caches = list(self.k_all.unbind(0))  # each contiguous
        if spec.v_dim_major:  # stored [.., num_kv_heads, head_dim, block_size], seen as K is
            self.v_all = self.kv_all[1].view(n, num_blocks, heads, dim, bs)
            self.v_caches = [v.permute(0, 3, 1, 2) for v in self.v_all.unbind(0)]
        else:
            self.v_all = self.kv_all[1].view(n, num_blocks, *spec.block_shape)
            self.v_caches = list(self.v_all.unbind(0))
        self.cpu_k = tensors((num_cpu_blocks, *spec.block_shape), dtype, n, pin_memory=pin)
        self.cpu_v = tensors((num_cpu_blocks, *spec.block_shape), dtype, n, pin_memory=pin)
        num_scaled = n if spec.is_fp8 else 0  # no scale tensors for a cache of the model dtype
        scales_shape = (2, num_scaled, num_blocks, *spec.scales_shape)
        self.kv_scales_all = torch.zeros(scales_shape, dtype=SCALE_DTYPE, device=device)
        self.k_scales_all, self.v_scales_all = self.kv_scales_all.unbind(0)
        self.k_scales = list(self.k_scales_all.unbind(0))
        self.v_scales = list(self.v_scales_all.unbind(0))
        self.cpu_k_scales = tensors((num_cpu_blocks, *spec.scales_shape), SCALE_DTYPE,
                                    num_scaled, pin_memory=pin)
        self.cpu_v_scales = tensors((num_cpu_blocks, *spec.scales_shape), SCALE_DTYPE,
                                    num_scaled, pin_memory=pin)
        self.device = device
        self.backend = backend

    @property
    def layers(self) -> list[KVCacheLayer]:
        """One `KVCacheLayer` per layer (scales None unless the cache is FP8)."""
        if not self.spec.is_fp8:
            return [KVCacheLayer(k, v) for k, v in zip(self.k_caches, self.v_caches)]
        return [KVCacheLayer(*t) for t in zip(self.k_caches, self.v_caches, self.k_scales,
                                              self.v_scales)]

    def _device_and_cpu(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every (device tensor, CPU pool tensor) pair indexed by block, fp8 ones as bytes."""
        device = self.k_caches + self.v_caches + self.k_scales + self.v_scales
        cpu = self.cpu_k + self.cpu_v + self.cpu_k_scales + self.cpu_v_scales
        return [(_as_bytes(d), _as_bytes(c)) for d, c in zip(device, cpu)]

    def gather_copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every block dst[i] gets, in every layer, the contents block src[i] had before the
        call (a dst may be another pair's src; dst ids must be distinct). Beam search copies
        partial blocks between slots this way (docs/design.md, "Beam search").

        Args:
            src, dst: [num_pairs] int64 block ids on the cache's device.
        """
        kv = _as_bytes(self.kv_all)
        kv.index_copy_(2, dst, kv.index_select(2, src))
        if self.spec.is_fp8:  # the scales travel with their blocks
            self.kv_scales_all.index_copy_(2, dst, self.kv_scales_all.index_select(2, src))

    def apply(self, pending: PendingCopies) -> None:
        """Perform queued block copies, scales with their blocks: swap-outs first (their
        device blocks may be handed out again this step), then copy-on-write copies (a copy's
        source may be a block freed this step and reused as a swap-in destination), then
        swap-ins."""
        if pending.swap_out:
            src = torch.tensor([s for s, _ in pending.swap_out], device=self.device)
            dst = torch.tensor([d for _, d in pending.swap_out])
            for dev, cpu in self._device_and_cpu():
                cpu[dst] = dev[src].to("cpu")
        if pending.copy:
            mapping = torch.tensor(pending.copy, dtype=torch.int64, device=self.device)
            copy_blocks([_as_bytes(t) for t in self.k_caches],
                        [_as_bytes(t) for t in self.v_caches], mapping, self.backend)
            if self.spec.is_fp8:
                copy_blocks(self.k_scales, self.v_scales, mapping, self.backend)
        if pending.swap_in:
            src = torch.tensor([s for s, _ in pending.swap_in])
            dst = torch.tensor([d for _, d in pending.swap_in], device=self.device)
            for dev, cpu in self._device_and_cpu():
                dev[dst] = cpu[src].to(self.device, non_blocking=True)
