"""Paged attention ops, dispatched to the Triton kernels or the torch reference.

`backend="auto"` picks Triton for CUDA tensors (when Triton is importable) and the torch
reference otherwise. `backend="triton"` on CPU tensors runs the Triton kernels under the
interpreter, which needs `TRITON_INTERPRET=1` set before triton is imported (tests do this).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch

from pagedrt.ops import attention_reference as ref

BACKENDS = ("auto", "torch", "triton")


class KVCacheLayer(NamedTuple):
    """One layer's paged KV cache, as the model's attention layers take it.

    Attributes:
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], the model's dtype
            or float8_e4m3fn.
        k_scales, v_scales: for a float8_e4m3fn cache, [num_blocks, num_kv_heads, block_size]
            float32 (`pagedrt.ops.fp8`); None otherwise.

    A plain `(k_cache, v_cache)` pair is accepted wherever this is: `KVCacheLayer(*pair)`.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scales: torch.Tensor | None = None
    v_scales: torch.Tensor | None = None


@dataclass
class AttentionMetadata:
    """Everything the attention layers need for one engine step (shared by all layers).

    Attributes:
        slot_mapping: [num_tokens] int64, cache slot of each new token (< 0: padding, skipped).
        block_tables: [num_seqs, max_blocks_per_seq] int32, padded with 0.
        seq_lens: [num_seqs] int32, tokens in the cache for each sequence after this step.
        cu_seqlens_q: [num_seqs + 1] int32, prefix sums of the query lengths.
        max_query_len: longest query chunk this step (1 means decode-only).
        max_seq_len: longest seq_len this step.
        backend: "auto", "torch" or "triton".
        query_block_tables, query_seq_lens: None, or (set by the verification CUDA graphs,
            pagedrt/engine/cuda_graphs.py) [num_tokens, max_blocks_per_seq] int32 and
            [num_tokens] int32: each query token's sequence's block-table row and its position
            + 1. Then every query token attends as a decode row of its own over its sequence's
            cache up to itself, which is causal attention within the chunk once the chunk's
            K/V are written (see docs/design.md, "Speculative decoding").
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    max_query_len: int
    max_seq_len: int
    backend: str = "auto"
    query_block_tables: torch.Tensor | None = None
    query_seq_lens: torch.Tensor | None = None

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401

        from pagedrt.ops import attention_triton  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a Triton without a usable backend
        return False
    return True


def check_backend(backend: str, device: torch.device) -> None:
    """Raise ValueError, naming the value and what works instead, where `backend` cannot run
    on `device`: "triton" without an importable Triton, or on the CPU outside Triton's
    interpreter (TRITON_INTERPRET=1, which the tests use)."""
    if backend != "triton":
        return
    if not triton_available():
        raise ValueError("attention_backend='triton' but triton (or pagedrt's kernels) cannot "
                         "be imported; use 'auto' or 'torch'")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("attention_backend='triton' on the CPU needs Triton's interpreter "
                         "(TRITON_INTERPRET=1 in the environment; slow, for tests); use 'auto' "
                         "or 'torch' here (--attention-backend on the command line)")


def _use_triton(backend: str, tensor: torch.Tensor) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; use one of {BACKENDS}")
    if backend == "torch":
        return False
    if backend == "triton":
        check_backend(backend, tensor.device)
        return True
    return tensor.is_cuda and triton_available()


@functools.lru_cache(maxsize=1)
def _triton_ops():
    """The Triton kernels' module, imported on first use (triton is optional)."""
    from pagedrt.ops import attention_triton

    return attention_triton


def uses_triton(backend: str, tensor: torch.Tensor) -> bool:
    """Whether the ops here run the Triton kernels for this backend and tensor."""
    return _use_triton(backend, tensor)


def write_kv(key, value, k_cache, v_cache, slot_mapping, backend: str = "auto",
             validate: bool = True, k_scales=None, v_scales=None,
             round_rows: bool = False) -> None:
    """Write key/value `[num_tokens, num_kv_heads, head_dim]` into the caches by slot_mapping.

    See `attention_reference.write_kv_reference` for shapes. validate=False skips the Triton
    wrapper's argument checks (for tensors the model built; see `pagedrt.ops.fused_triton`).
    k_scales, v_scales: an FP8 cache's scales (see `KVCacheLayer`), else None. round_rows:
    into an FP8 cache, also leave key and value holding what the cache holds.
    """
    if _use_triton(backend, key):
        return _triton_ops().write_kv_triton(key, value, k_cache, v_cache, slot_mapping,
                                             validate=validate, k_scales=k_scales,
                                             v_scales=v_scales, round_rows=round_rows)
    return ref.write_kv_reference(key, value, k_cache, v_cache, slot_mapping, k_scales, v_scales,
                                  round_rows)


def paged_attention_decode(
    query, k_cache, v_cache, block_tables, seq_lens, scale, backend: str = "auto",
    validate: bool = True, sliding_window: int | None = None, k_scales=None, v_scales=None,
) -> torch.Tensor:
    """Decode attention (one query token per sequence); see the reference for shapes.

    sliding_window: attend only to the last `sliding_window` tokens; None = all of them.
    """
    if _use_triton(backend, query):
        return _triton_ops().paged_attention_decode_triton(
            query, k_cache, v_cache, block_tables, seq_lens, scale, validate=validate,
            sliding_window=sliding_window, k_scales=k_scales, v_scales=v_scales)
    return ref.paged_attention_decode_reference(query, k_cache, v_cache, block_tables, seq_lens,
                                                scale, sliding_window, k_scales, v_scales)


def paged_attention_extend(
    query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, backend: str = "auto",
    max_query_len: int | None = None, validate: bool = True, sliding_window: int | None = None,
    k_scales=None, v_scales=None, key=None, value=None,
) -> torch.Tensor:
    """Causal attention of packed query chunks over cached prefixes; see the reference.

    max_query_len: longest query chunk, when the caller knows it (saves the Triton wrapper a
    device-to-host read). sliding_window: each query attends only to its last
    `sliding_window` positions; None = the whole prefix. key, value: the chunks' own K/V
    `[num_tokens, num_kv_heads, head_dim]`; over an FP8 cache without a window, the chunks
    attend to these rows (as `write_kv` with round_rows left them) and read only their
    prefixes from the cache (the Triton kernel's FRESH_CHUNK_KV); None reads every key from
    the cache.
    """
    if _use_triton(backend, query):
        return _triton_ops().paged_attention_extend_triton(
            query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale,
            max_query_len=max_query_len, validate=validate, sliding_window=sliding_window,
            k_scales=k_scales, v_scales=v_scales, key=key, value=value,
        )
    return ref.paged_attention_extend_reference(
        query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, sliding_window,
        k_scales, v_scales, key, value,
    )


def copy_blocks(k_caches, v_caches, block_mapping, backend: str = "auto") -> None:
    """Copy blocks src -> dst in every layer; block_mapping `[num_pairs, 2]` int64."""
    if block_mapping.numel() and _use_triton(backend, k_caches[0]):
        from pagedrt.ops.attention_triton import copy_blocks_triton

        return copy_blocks_triton(k_caches, v_caches, block_mapping)
    return ref.copy_blocks_reference(k_caches, v_caches, block_mapping)


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_written: bool = False,
    sliding_window: int | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """What an attention layer calls: write the new K/V (unless `kv_written`: the caller's
    fused RoPE kernel did), then decode or extend (or decode per query token, when `meta` has
    query_seq_lens), over the last `sliding_window` positions of each query when the layer
    has one. The model builds every tensor here itself, so the Triton wrappers skip their
    argument checks. k_scales, v_scales: an FP8 cache's scales (see `KVCacheLayer`), else
    None. Into an FP8 cache the write leaves key and value holding what the cache holds
    (round_rows; a fused writer must have done the same), and a prefill reads its own K/V
    from them (`paged_attention_extend`'s key and value)."""
    if not kv_written:
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping, meta.backend, validate=False,
                 k_scales=k_scales, v_scales=v_scales, round_rows=True)
    if meta.max_query_len == 1:  # decode only
        return paged_attention_decode(
            query, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, meta.backend,
            validate=False, sliding_window=sliding_window, k_scales=k_scales, v_scales=v_scales,
        )
    if meta.query_seq_lens is not None:  # a short chunk per sequence, each token as a decode
        return paged_attention_decode(
            query, k_cache, v_cache, meta.query_block_tables, meta.query_seq_lens, scale,
            meta.backend, validate=False, sliding_window=sliding_window, k_scales=k_scales,
            v_scales=v_scales,
        )
    return paged_attention_extend(
        query, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, scale,
        meta.backend, max_query_len=meta.max_query_len, validate=False,
        sliding_window=sliding_window, k_scales=k_scales, v_scales=v_scales, key=key,
        value=value,
    )
