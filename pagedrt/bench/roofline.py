"""The honest roofline of an offline run: the time a minimal engine would take for the same
requests on the same device, counting only the work it must do.

For requests i with prompt length L_i and T_i generated tokens, on a model with P_body
parameters outside the embedding and LM head (attention, MLP and norm weights of every layer,
the final norm), an LM head of V x hidden, `layers` layers of `heads` query heads of width d,
and K/V of `kv_bytes_per_token` bytes per token over all layers. A request needs T_i forward
passes one after the other (each token is the next pass's input), so the minimal engine runs
the plain schedule: step 1 prefills every prompt and samples each first token; step j >= 2
decodes every request with T_i >= j, at context c_ij = L_i + j - 1 (its own token included).

  step 1     FLOPs  sum_i [ 2 P_body L_i + 4 d heads layers L_i (L_i + 1) / 2 ] + n 2 V hidden
             bytes  (P_body + V hidden) e
  step j     FLOPs  sum_{i running} [ 2 P_body + 4 d heads layers c_ij + 2 V hidden ]
             bytes  (P_body + V hidden) e + sum_{i running} kv_bytes_per_token c_ij
  floor      sum over steps of max(FLOPs / matmul FLOP/s, bytes / read bytes/s)

That is: matmuls at every forwarded position, causal attention (QK^T and PV, 4 d FLOPs per
query-key pair per head), the LM head only where a token is sampled, every weight read once per
step (e bytes each; the embedding is gathered, not read whole), each cached K/V byte read once
per decode step. Both rates are the run's own ceilings (`pagedrt.bench.common.device_ceilings`:
a large bf16 read and an 8192^3 matmul in the model's dtype, bf16 in the GPU runs of record).
Not counted: K/V writes, activations, sampling, launch latency. Sliding-window layers would
attend to fewer positions; the formula counts full causal attention. Efficiency = floor /
measured time.

`bound_s` is the looser bound max(total FLOPs / FLOP/s, total bytes / bytes/s), which an engine
overlapping one request's prefill with another's decode could approach; BENCHMARKS.md's
efficiencies use `floor_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedrt.config import ModelConfig


@dataclass(frozen=True)
class RooflineModel:
    """The model sizes the floor needs: parameter counts and attention shape."""

    body_params: int  # every parameter outside the embedding table and the LM head
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, mc: ModelConfig) -> RooflineModel:
        """Counts from the architecture's checkpoint shapes (`hf_weight_shapes` of its
        registered class; no model is built)."""
        import math

        from pagedrt.models.registry import model_class

        shapes = model_class(mc.architecture).hf_weight_shapes(mc)
        body = sum(math.prod(shape) for name, shape in shapes.items()
                   if "embed_tokens" not in name and "lm_head" not in name)
        return cls(body, mc.vocab_size, mc.hidden_size, mc.num_hidden_layers,
                   mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim)

    @classmethod
    def from_module(cls, model, mc: ModelConfig) -> RooflineModel:
        """Counts from a built model's parameters: everything except those named
        `embed_tokens` or `lm_head` is body (a tied LM head is the embedding, counted once as
        the LM head)."""
        body = sum(p.numel() for name, p in model.named_parameters()
                   if "embed_tokens" not in name and "lm_head" not in name)
        return cls(body, mc.vocab_size, mc.hidden_size, mc.num_hidden_layers,
                   mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim)


def roofline_floor(m: RooflineModel, prompt_lens: list[int], output_lens: list[int],
                   ceilings: dict, weight_bytes: int, kv_bytes: float | None = None) -> dict:
    """The floor of the module docstring for requests of `prompt_lens[i]` prompt tokens and
    `output_lens[i]` generated tokens.

    ceilings: {"read_bytes_per_s", "matmul_flop_per_s"}. weight_bytes: bytes per weight
    element (2 for bf16). kv_bytes: bytes per cached K or V element (default weight_bytes; an
    FP8 cache's is 1 + 4 / head_dim, its scales included).
    Returns {"floor_s", "bound_s", "flops", "bytes", "steps", "compute_bound_steps"} (seconds,
    FLOPs and bytes summed over the steps).

    Raises:
        ValueError: the two lists differ in length, or a length is below 1.
    """
    import numpy as np

    if len(prompt_lens) != len(output_lens):
        raise ValueError(f"{len(prompt_lens)} prompt lengths for {len(output_lens)} outputs")
    if any(x < 1 for x in (*prompt_lens, *output_lens)):
        raise ValueError("every prompt and output length must be at least 1")
    bw, peak = ceilings["read_bytes_per_s"], ceilings["matmul_flop_per_s"]
    kv_elem = weight_bytes if kv_bytes is None else kv_bytes
    kv_per_token = 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * kv_elem
    attn_per_pair = 4 * m.head_dim * m.num_attention_heads * m.num_hidden_layers
    lm_head = m.vocab_size * m.hidden_size
    weights = (m.body_params + lm_head) * weight_bytes
    L = np.asarray(prompt_lens, dtype=np.int64)
    T = np.asarray(output_lens, dtype=np.int64)
    # step 1: every prompt, one sampled token each
    flops = [int(2 * m.body_params * L.sum() + attn_per_pair * (L * (L + 1) // 2).sum()
                 + 2 * lm_head * len(L))]
    nbytes = [weights]
    # steps 2..max(T): the requests still running decode one token at context L + j - 1
    order = np.argsort(T)
    T_sorted, L_sorted = T[order], L[order]
    L_suffix = np.concatenate([np.cumsum(L_sorted[::-1])[::-1], [0]])  # sum of L over [k:]
    for j in range(2, int(T.max()) + 1):
        first = int(np.searchsorted(T_sorted, j))  # rows with T >= j start here
        rows = len(T_sorted) - first
        context = int(L_suffix[first]) + (j - 1) * rows
        flops.append(rows * 2 * (m.body_params + lm_head) + attn_per_pair * context)
        nbytes.append(weights + kv_per_token * context)
    step_s = [max(f / peak, b / bw) for f, b in zip(flops, nbytes)]
    total_flops, total_bytes = sum(flops), sum(nbytes)
    return {"floor_s": sum(step_s), "bound_s": max(total_flops / peak, total_bytes / bw),
            "flops": total_flops, "bytes": total_bytes, "steps": len(step_s),
            "compute_bound_steps": sum(f / peak > b / bw for f, b in zip(flops, nbytes))}
