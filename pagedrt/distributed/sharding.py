"""How a model is split over N tensor-parallel ranks (Megatron-LM style: Shoeybi et al. 2019,
"Megatron-LM"), and the checks that refuse a split that does not fit, before anything starts.

    query heads   H / N per rank, contiguous: rank r holds heads [r H/N, (r+1) H/N)
    KV heads      N <= K: K / N per rank, contiguous (N must divide K)
                  N >  K: one per rank, replicated: KV head k lives on the N / K ranks
                          [k N/K, (k+1) N/K), exactly those whose query heads it serves
                          (N must be a multiple of K)
    q, k, v, gate, up   column-parallel (output features split; no communication)
    o_proj, down        row-parallel (input features split; one all-reduce each)
    embedding, LM head  vocabulary rows split, ceil(V / N) per rank (the last one padded);
                        the embedding all-reduces its masked lookup, the LM head gathers logits

So a decoder layer costs two all-reduces of [num_tokens, hidden_size], and every rank ends the
step with the same hidden states and the same full logits (docs/design.md).
"""

from __future__ import annotations

from pagedrt.config import ModelConfig


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: num_kv_heads / tp_size, or 1 (replicated) when there are more
    ranks than KV heads."""
    return max(1, num_kv_heads // tp_size)


def kv_head_shard(tp_rank: int, num_kv_heads: int, tp_size: int) -> int:
    """Which block of `kv_heads_per_rank` KV heads rank `tp_rank` holds (the block index into
    the full K and V projections): its own with N <= K, that of its query heads with N > K."""
    num_replicas = max(1, tp_size // num_kv_heads)
    return tp_rank // num_replicas


def _fits(mc: ModelConfig, n: int) -> bool:
    kv = mc.num_key_value_heads
    kv_ok = kv % n == 0 if n <= kv else n % kv == 0
    return mc.num_attention_heads % n == 0 and kv_ok and mc.intermediate_size % n == 0


def valid_tp_sizes(mc: ModelConfig) -> list[int]:
    """Every tensor_parallel_size this model can be split over."""
    return [n for n in range(1, mc.num_attention_heads + 1) if _fits(mc, n)]


def check_tensor_parallel(mc: ModelConfig, tp_size: int) -> None:
    """Raise ValueError, naming the sizes that work, unless `tp_size` splits the model: it must
    divide num_attention_heads and intermediate_size, and divide num_key_value_heads or be a
    multiple of it."""
    if _fits(mc, tp_size):
        return
    kv = mc.num_key_value_heads
    if mc.num_attention_heads % tp_size:
        why = f"does not divide num_attention_heads={mc.num_attention_heads}"
    elif mc.intermediate_size % tp_size:
        why = f"does not divide intermediate_size={mc.intermediate_size}"
    else:
        why = (f"neither divides num_key_value_heads={kv} nor is a multiple of it (each rank "
               "must hold whole KV heads, or one KV head replicated on whole groups of ranks)")
    raise ValueError(
        f"tensor_parallel_size={tp_size} {why}; this model ({mc.architecture}, "
        f"{mc.num_attention_heads} heads, {kv} KV heads) can use "
        f"tensor_parallel_size {', '.join(map(str, valid_tp_sizes(mc)))}")


def check_devices(tp_size: int, device_type: str, first_index: int, num_visible: int) -> None:
    """Raise ValueError if `tp_size` ranks, one per GPU from `first_index` on, need more GPUs
    than the `num_visible` CUDA devices (CPU ranks need none)."""
    if device_type != "cuda" or first_index + tp_size <= num_visible:
        return
    start = f" from cuda:{first_index} on" if first_index else ""
    raise ValueError(
        f"tensor_parallel_size={tp_size} needs {tp_size} GPUs{start}, but {num_visible} "
        f"{'is' if num_visible == 1 else 'are'} visible (CUDA_VISIBLE_DEVICES selects them); "
        "lower tensor_parallel_size or run on a machine with more GPUs")
