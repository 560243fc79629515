"""Plain-PyTorch paged attention: the CPU backend and the oracle for the Triton kernels.

Every function here has the same signature as its Triton twin in `attention_triton.py`.
They gather each sequence's keys and values through its block table and only ever touch the
first `seq_lens[i]` slots, so stale or NaN data in unused slots cannot leak into the output.

Sliding window (`sliding_window=W`, as in Mistral and Gemma 3's local layers): the query at
position p sees keys p - W + 1 .. p, its last W positions (itself included). Keys before the
window are neither gathered (extend) nor let into the arithmetic (decode zeroes them), so the
blocks that hold them may have been handed to another sequence (docs/design.md, "Sliding
window").

Cache layout (per layer): `k_cache`, `v_cache` of shape
`[num_blocks, block_size, num_kv_heads, head_dim]`; slot `s` is block `s // block_size`,
offset `s % block_size`. An FP8 cache (float8_e4m3fn) comes with `k_scales`, `v_scales` of
shape `[num_blocks, num_kv_heads, block_size]` float32 (`pagedrt.ops.fp8`): the write
quantizes with `quantize_fp8`, the attention functions dequantize what they gather in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedrt.ops.fp8 import dequantize_fp8, quantize_fp8


def write_kv_reference(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; < 0 means skip (padding)
    k_scales: torch.Tensor | None = None,  # FP8 cache: [num_blocks, num_kv_heads, block_size]
    v_scales: torch.Tensor | None = None,
    round_rows: bool = False,
) -> None:
    """Write new K/V rows into their cache slots, in place. Negative slots are skipped.
    With k_scales/v_scales (an FP8 cache), rows are quantized by `quantize_fp8` and their
    scales written too, and with `round_rows` each written row of key and value is
    overwritten with what the cache holds (`dequantize_fp8`, rounded to the row's dtype)."""
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size  # (any cache strides: V's may
    if k_scales is None:                                        # be a dim-major view)
        k_cache[blocks, offsets] = key[valid].to(k_cache.dtype)
        v_cache[blocks, offsets] = value[valid].to(v_cache.dtype)
        return
    for cache, scales, x in ((k_cache, k_scales, key), (v_cache, v_scales, value)):
        values, row_scales = quantize_fp8(x[valid])  # [n, heads, head_dim], [n, heads]
        cache.view(torch.uint8)[blocks, offsets] = values.view(torch.uint8)
        scales.transpose(1, 2)[blocks, offsets] = row_scales  # [num_blocks, slot, heads] view
        if round_rows:
            x[valid] = dequantize_fp8(values, row_scales).to(x.dtype)


def _dequantized(cache: torch.Tensor, scales: torch.Tensor | None,
                 blocks: torch.Tensor) -> torch.Tensor:
    """The cache's blocks `blocks` (any index shape) in fp32:
    [*blocks.shape, block_size, num_kv_heads, head_dim], scaled when `scales` is given."""
    out = cache[blocks].float()
    if scales is not None:
        out *= scales[blocks].transpose(-1, -2)[..., None]
    return out


def _gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, start: int,
    end: int, k_scales: torch.Tensor | None = None, v_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions [start, end) of one sequence, `[end - start, num_kv_heads,
    head_dim]` each (fp32, dequantized, for an FP8 cache; the cache's dtype otherwise); only
    the blocks holding those positions are read."""
    block_size = k_cache.shape[1]
    first_block = start // block_size
    num_blocks = (end + block_size - 1) // block_size
    blocks = block_table[first_block:num_blocks].long()
    offset = start - first_block * block_size
    if k_scales is not None:
        k = _dequantized(k_cache, k_scales, blocks).flatten(0, 1)
        v = _dequantized(v_cache, v_scales, blocks).flatten(0, 1)
    else:
        k = k_cache[blocks].flatten(0, 1)
        v = v_cache[blocks].flatten(0, 1)
    k = k[offset:offset + end - start]
    v = v[offset:offset + end - start]
    return k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            first_key: int = 0, sliding_window: int | None = None) -> torch.Tensor:
    """Causal attention of the last `q_len` positions over keys from position `first_key` on,
    computed in fp32; with `sliding_window` W, each query sees only its last W positions.

    q: [q_len, num_heads, head_dim]; k, v: [kv_len, num_kv_heads, head_dim], the keys of
    positions first_key .. first_key + kv_len - 1 (the last query's position).
    Returns [q_len, num_heads, head_dim] in q's dtype.
    """
    q_len, num_heads, _ = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    qf = q.float().transpose(0, 1)  # [num_heads, q_len, head_dim]
    kf = k.float().transpose(0, 1).repeat_interleave(group, dim=0)  # [num_heads, kv_len, d]
    vf = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    end = first_key + kv_len  # one past the last query's position
    # query i sits at position end - q_len + i and sees keys (pos - W, pos]
    q_pos = torch.arange(end - q_len, end, device=q.device)[:, None]  # [q_len, 1]
    k_pos = torch.arange(first_key, end, device=q.device)[None, :]  # [1, kv_len]
    mask = k_pos <= q_pos  # [q_len, kv_len]
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale)
    return out.transpose(0, 1).to(q.dtype)


def paged_attention_decode_reference(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, current token included
    scale: float,
    sliding_window: int | None = None,
    k_scales: torch.Tensor | None = None,  # FP8 cache: [num_blocks, num_kv_heads, block_size]
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query token per sequence attending to all `seq_lens[i]` cached tokens (the last
    `sliding_window` of them when given).

    Batched: every sequence's blocks are gathered into a padded [num_seqs, L] view; slots at or
    past seq_len, and before the window, are zeroed (so NaN or another sequence's data there
    cannot spread) and their scores set to -inf.
    """
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = int(seq_lens.max())
    num_blocks = (max_len + block_size - 1) // block_size
    idx = block_tables[:, :num_blocks].long()
    # advanced indexing copies, so the gathered K/V can be zeroed in place past each seq_len
    k = _dequantized(k_cache, k_scales, idx).flatten(1, 2)  # [num_seqs, L, kv_heads, head_dim]
    v = _dequantized(v_cache, v_scales, idx).flatten(1, 2)
    pos = torch.arange(k.shape[1], device=query.device)[None, :]  # [1, L]
    valid = pos < seq_lens[:, None]  # [S, L]
    if sliding_window is not None:
        valid &= pos >= seq_lens[:, None] - sliding_window
    k.masked_fill_(~valid[:, :, None, None], 0.0)
    v.masked_fill_(~valid[:, :, None, None], 0.0)
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,slkd->skgl", q, k) * scale  # [S, kv_heads, group, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("skgl,slkd->skgd", probs, v)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def paged_attention_extend_reference(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    sliding_window: int | None = None,
    k_scales: torch.Tensor | None = None,  # FP8 cache: [num_blocks, num_kv_heads, block_size]
    v_scales: torch.Tensor | None = None,
    key: torch.Tensor | None = None,  # [num_tokens, num_kv_heads, head_dim], packed as query
    value: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention for packed query chunks over cached prefixes.

    The query tokens of sequence i are the last `cu_seqlens_q[i+1] - cu_seqlens_q[i]` of its
    `seq_lens[i]` cached tokens (their K/V already written). This covers prefill, chunked
    prefill, prefix-cache hits and decode (query length 1). With `sliding_window` W, each query
    sees its last W positions; only keys from the first query's window on are gathered.
    With an FP8 cache, `key` and `value` (the chunks' own K/V, as `write_kv_reference` with
    round_rows left them) and no window, each chunk takes its own keys from `key`/`value`
    and only its prefix from the cache, as the Triton kernel's FRESH_CHUNK_KV
    (`attention_extend_triton`); otherwise every key comes from the cache.
    """
    out = torch.empty_like(query)
    starts = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    fresh = k_scales is not None and key is not None and sliding_window is None
    decode_seqs = [] if fresh else [  # (with fresh rows every chunk takes the loop below)
        i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
    if decode_seqs:  # one-token queries: the batched decode path
        rows = torch.tensor([starts[i] for i in decode_seqs], device=query.device)
        sel = torch.tensor(decode_seqs, device=query.device)
        out[rows] = paged_attention_decode_reference(
            query[rows], k_cache, v_cache, block_tables[sel], seq_lens[sel], scale,
            sliding_window, k_scales, v_scales,
        )
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        if q_end - q_start == 0 or (q_end - q_start == 1 and not fresh):
            continue
        first_key = 0
        if sliding_window is not None:  # the window of the chunk's first query
            first_key = max(seq_len - (q_end - q_start) - sliding_window + 1, 0)
        cache_end = seq_len - (q_end - q_start) if fresh else seq_len
        k, v = _gather_kv(k_cache, v_cache, block_tables[i], first_key, cache_end, k_scales,
                          v_scales)
        if fresh:  # the chunk's own K/V, from the rows
            k = torch.cat([k, key[q_start:q_end].float()])
            v = torch.cat([v, value[q_start:q_end].float()])
        out[q_start:q_end] = _attend(query[q_start:q_end], k, v, scale, first_key,
                                     sliding_window)
    return out


def copy_blocks_reference(
    k_caches: list[torch.Tensor],  # per layer [num_blocks, block_size, num_kv_heads, head_dim]
    v_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,  # [num_pairs, 2] int64: (src block, dst block)
) -> None:
    """Copy whole blocks src -> dst in every layer (copy-on-write), in place; any tensors
    indexed by block first (an FP8 cache's scales too)."""
    if block_mapping.numel() == 0:
        return
    src = block_mapping[:, 0].to(k_caches[0].device)
    dst = block_mapping[:, 1].to(k_caches[0].device)
    for k_cache, v_cache in zip(k_caches, v_caches):
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
