"""Small helpers shared by the Triton wrappers: contract checks and launch constants."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

try:  # programmatic dependent launch (Hopper and later); older Triton builds lack it
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

from pagedrt.env_flags import env_flag
from pagedrt.ops.fp8 import FP8_DTYPE, SCALE_DTYPE, is_fp8

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CACHE_DTYPES = (*SUPPORTED_DTYPES, FP8_DTYPE)  # an FP8 cache comes with scales (fp8.py)
LOG2E = 1.4426950408889634  # log2(e): the kernels use exp2, so scores are scaled by it


def interpreting(tensor: torch.Tensor) -> bool:
    """True when the kernels run under Triton's CPU interpreter.

    The interpreter computes `tl.dot` of two bf16 operands wrongly (garbage, seen on triton
    3.9), so kernels take this as a constexpr flag and upcast dot operands to fp32 when set.
    """
    return os.environ.get("TRITON_INTERPRET") == "1" or not tensor.is_cuda


@functools.lru_cache(maxsize=8)
def num_sms(device_index: int | None) -> int:
    """Multiprocessor count of a CUDA device (4 for the CPU interpreter)."""
    if device_index is None or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sms(tensor: torch.Tensor) -> int:
    return num_sms(tensor.device.index if tensor.is_cuda else None)


PDL_REQUESTED = env_flag("PAGEDRT_PDL")  # read once: checked at every launch
PDL_MAX_ROWS = 256  # launches over more rows (tokens, sequences) than this run without PDL


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_enabled(tensor: torch.Tensor) -> bool:
    """Whether the decode step's kernels on `tensor`'s device launch with programmatic
    dependent launch (PDL; CUDA programming guide, "Programmatic Dependent Launch and
    Synchronization"): unless PAGEDRT_PDL=0 when pagedrt was imported (`PDL_REQUESTED`), on
    a GPU of compute capability 9.0 or later, with a Triton that has it, outside the
    interpreter, for launches over at most PDL_MAX_ROWS rows (`tensor.shape[0]`: tokens or
    sequences; the decode step's kernels, not prefill's). A kernel launched so may start
    while the one before it finishes; each such kernel calls `pdl_prologue`, which waits for
    the one before, and reads before it only what the kernel before cannot be writing (the
    weights; see `pdl_prologue`). Batch-1 decode on the H200: 0.89 -> 0.79 ms per token, 0.67 with the
    weights read before the wait (docs/design.md, "Small-batch decode")."""
    return (PDL_REQUESTED and gdc_wait is not None and tensor.shape[0] <= PDL_MAX_ROWS
            and not interpreting(tensor) and _pdl_capable(tensor.device.index or 0))


def pdl_launch(enabled: bool) -> dict:
    """The launch options of a kernel launched with PDL when `enabled` (`pdl_enabled`): its
    constexpr PDL and Triton's launch_pdl, the latter only when set, so that the default
    launch passes nothing a Triton without PDL would not know."""
    return {"PDL": True, "launch_pdl": True} if enabled else {"PDL": False}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """Where a kernel that may be launched with PDL waits until the kernel before it has
    finished and its writes are visible (`griddepcontrol.wait`), then lets the kernel after it
    launch (`griddepcontrol.launch_dependents`; its own prologue waits for this one). Nothing
    when PDL is False.

    Before this call a kernel may read only what the kernel just before it cannot be writing:
    the weights (no kernel writes them), and what kernels two or more launches back wrote,
    such as the lengths and block tables the step's first kernels compute. That holds
    because launch_dependents stays after the wait: kernel i + 1 starts only once every
    program of kernel i has passed its wait, i.e. once kernel i - 1 has finished. Keep that
    order."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def tile_load(ptrs, mask, MASKED: tl.constexpr):
    """tl.load of ptrs, masked (other 0) when MASKED, else not at all (a decode tile that lies
    wholly below the partition's end loads unmasked, so its loads can stay 16 bytes wide)."""
    if MASKED:
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def load_group_query(q_ptr, seq, kv_head, stride_qs, stride_qh, scale_log2,
                     GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                     UPCAST: tl.constexpr, F16_MMA: tl.constexpr):
    """The decode kernels' query operand: the GROUP query heads of `kv_head` for sequence
    `seq`, padded with zero rows to GROUP_PAD, as [GROUP_PAD, HEAD_DIM] (fp32 when UPCAST, the
    interpreter's dot; with F16_MMA, products in fp16 over an FP8 cache, divided by 64 (exact)
    and cast to fp16, with scale_log2 multiplied by 64 instead: `attention_triton`'s module
    doc). Returns (q, heads [GROUP_PAD] the query-head indices, g_mask [GROUP_PAD] the real
    rows, scale_log2)."""
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None], other=0.0)
    q, scale_log2 = query_operand(q, scale_log2, UPCAST, F16_MMA)
    return q, heads, g_mask, scale_log2


@triton.jit
def query_operand(q, scale_log2, UPCAST: tl.constexpr, F16_MMA: tl.constexpr):
    """A loaded query tile as the decode kernels' dot operand (`load_group_query`): fp32 when
    UPCAST; with F16_MMA divided by 64 and cast to fp16, scale_log2 multiplied by 64.
    Returns (q, scale_log2)."""
    if UPCAST:
        q = q.to(tl.float32)
    if F16_MMA:
        q = (q.to(tl.float32) * 0.015625).to(tl.float16)  # / 64, exact
        scale_log2 = scale_log2 * 64.0
    return q, scale_log2


def check_cache(name: str, cache: torch.Tensor) -> None:
    """The cache contract: 4-D `[num_blocks, block_size, num_kv_heads, head_dim]`, head_dim
    contiguous (stride 1) so loads along it vectorize to 16 bytes."""
    if cache.dim() != 4:
        raise ValueError(f"{name} must be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got shape {tuple(cache.shape)}")
    if cache.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) is {cache.stride(-1)}; head_dim must be contiguous")
    if cache.dtype not in CACHE_DTYPES:
        raise ValueError(f"{name}.dtype is {cache.dtype}; supported: {CACHE_DTYPES}")


def check_same(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"{name_a} ({tuple(a.shape)}, {a.dtype}, {a.device}) and {name_b} "
                         f"({tuple(b.shape)}, {b.dtype}, {b.device}) must match")


def check_index(name: str, t: torch.Tensor, dim: int, dtypes: tuple, device) -> None:
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}.dtype is {t.dtype}; expected one of {dtypes}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the caches on {device}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) is {t.stride(-1)}; its last dim must be contiguous")


def check_head_dim(head_dim: int) -> None:
    if head_dim not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim={head_dim}; the Triton kernels take 16, 32, 64, 128 or 256 "
                         "(use backend='torch' for others)")


def v_dim_major(v_cache: torch.Tensor) -> bool:
    """Whether a V cache [num_blocks, block_size, num_kv_heads, head_dim] is a view of
    [num_blocks, num_kv_heads, head_dim, block_size] storage (an FP8 cache's V by default,
    `KVCacheSpec.v_dim_major`; not for sliding-window models, nor with
    PAGEDRT_FP8_V_DIM_MAJOR=0):
    the tokens of a block are contiguous per (head, dim), so a tile of V is read with wide
    loads along tokens, the order in which the P @ V product consumes it. (Called per kernel
    launch: the usual layout, head_dim's stride 1, is told apart before any view is made.)"""
    return (v_cache.dim() == 4 and v_cache.shape[1] > 1 and v_cache.stride(3) != 1
            and v_cache.permute(0, 2, 3, 1).is_contiguous())


def to_v_dim_major(cache: torch.Tensor) -> torch.Tensor:
    """A copy of `cache` [num_blocks, block_size, num_kv_heads, head_dim] stored dim-major
    ([num_blocks, num_kv_heads, head_dim, block_size]) and seen with the same shape: the layout
    of an FP8 cache's V in the engine by default (`v_dim_major`)."""
    return cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def check_cache_pair(k_cache, v_cache) -> tuple[int, int, int]:
    """K and V caches of one layer: the cache contract, identical shape, dtype and device, a
    supported head_dim; V's strides are K's, or those of the dim-major layout (`v_dim_major`).
    Returns (block_size, num_kv_heads, head_dim)."""
    check_cache("k_cache", k_cache)
    check_same("k_cache", k_cache, "v_cache", v_cache)
    if k_cache.stride() != v_cache.stride() and not v_dim_major(v_cache):
        raise ValueError(
            f"v_cache strides {v_cache.stride()} are neither k_cache's {k_cache.stride()} nor "
            "those of a view of [num_blocks, num_kv_heads, head_dim, block_size] storage")
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    check_head_dim(head_dim)
    return block_size, num_kv_heads, head_dim


def check_kv_scales(k_cache, k_scales, v_scales) -> None:
    """An FP8 cache's scales: both given, [num_blocks, num_kv_heads, block_size] float32 on the
    cache's device, slot stride 1, identical strides; a cache of another dtype takes none."""
    if not is_fp8(k_cache.dtype):
        if k_scales is not None or v_scales is not None:
            raise ValueError(f"k_scales / v_scales are for a {FP8_DTYPE} cache; this cache is "
                             f"{k_cache.dtype}: pass None")
        return
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    expected = (num_blocks, num_kv_heads, block_size)
    for name, t in (("k_scales", k_scales), ("v_scales", v_scales)):
        if t is None:
            raise ValueError(f"a {FP8_DTYPE} cache needs {name} [num_blocks, num_kv_heads, "
                             f"block_size] = {list(expected)} {SCALE_DTYPE}")
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} shape {tuple(t.shape)}; expected {expected} "
                             "[num_blocks, num_kv_heads, block_size]")
        check_index(name, t, 3, (SCALE_DTYPE,), k_cache.device)
    if k_scales.stride() != v_scales.stride():
        raise ValueError(
            f"k_scales strides {k_scales.stride()} != v_scales strides {v_scales.stride()}")


def check_paged_args(query, k_cache, v_cache, block_tables, seq_lens, k_scales=None,
                     v_scales=None) -> tuple[int, int]:
    """Contract shared by the decode and extend kernels: the caches (and an FP8 cache's
    scales), the query's dtype (the cache's, or any supported one over an FP8 cache) and head
    layout, block_tables and seq_lens. Returns (num_kv_heads, head_dim)."""
    _, num_kv_heads, head_dim = check_cache_pair(k_cache, v_cache)
    check_kv_scales(k_cache, k_scales, v_scales)
    query_dtypes = SUPPORTED_DTYPES if is_fp8(k_cache.dtype) else (k_cache.dtype,)
    check_index("query", query, 3, query_dtypes, k_cache.device)
    _, num_heads, q_dim = query.shape
    if q_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"query shape {tuple(query.shape)}: head_dim must be {head_dim} and "
                         f"num_heads a multiple of num_kv_heads={num_kv_heads}")
    check_index("block_tables", block_tables, 2, (torch.int32,), k_cache.device)
    check_index("seq_lens", seq_lens, 1, (torch.int32,), k_cache.device)
    return num_kv_heads, head_dim


def check_decode_args(query, k_cache, v_cache, block_tables, seq_lens, k_scales=None,
                      v_scales=None) -> tuple[int, int]:
    """Contract of the decode kernels; returns (group size, num_kv_heads)."""
    num_kv_heads, _ = check_paged_args(query, k_cache, v_cache, block_tables, seq_lens,
                                       k_scales, v_scales)
    num_seqs, num_heads, _ = query.shape
    if block_tables.shape[0] < num_seqs or seq_lens.shape[0] < num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows and seq_lens "
                         f"{seq_lens.shape[0]} entries for {num_seqs} sequences")
    return num_heads // num_kv_heads, num_kv_heads


def check_sliding_window(sliding_window: int | None) -> None:
    """A sliding window is None (full attention) or a positive number of tokens."""
    if sliding_window is not None and (
            isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
            or sliding_window < 1):
        raise ValueError(f"sliding_window={sliding_window!r}; give a number of tokens >= 1, "
                         "or None for full attention")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


_FITTING_CONFIG: dict = {}


def env_config(name: str, fields: tuple[str, ...], example: str) -> dict | None:
    """A launch config from environment variable `name`, comma-separated positive ints in the
    order of `fields` (a tuning override; docs/design.md, "Prefill by parts"): {field: value},
    or None where unset or blank.

    Raises:
        ValueError: not len(fields) comma-separated positive ints; names the variable, the
            value and the expected form with `example`.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != len(fields) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{name}={value!r}: expected {len(fields)} positive ints, "
                         f"{','.join(fields)} (e.g. {example})")
    return dict(zip(fields, map(int, parts)))


def launch_first_fitting(key: tuple, configs: list[dict], launch: Callable[[dict], None]) -> None:
    """Launch with the first of `configs` whose tiles fit the GPU's shared memory.

    The tuned config comes first; smaller ones follow for GPUs with less shared memory than
    an H200 (about 100 KB on many consumer cards). Triton raises OutOfResources when it loads
    the compiled kernel, before anything runs, so falling through to the next is safe. The
    config that fitted is remembered per key, so the search happens once per shape class.
    """
    start = _FITTING_CONFIG.get(key, 0)
    error = None
    for i in range(start, len(configs)):
        try:
            launch(configs[i])
        except OutOfResources as e:
            error = e
            continue
        _FITTING_CONFIG[key] = i
        return
    raise ValueError(f"no launch config fits this GPU's shared memory for {key}: {error}")
