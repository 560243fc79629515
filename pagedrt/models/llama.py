"""Llama-family decoder over packed tokens and a paged KV cache (Llama 2/3, SmolLM, Qwen2,
Qwen3, Mistral).

Qwen2 is the same network with a bias on the q/k/v projections (`config.attention_bias`);
Qwen3 drops the bias and adds an RMSNorm over each query and key head before RoPE
(`config.qk_norm`); Mistral is Llama's network with a sliding window on every layer (Qwen2/3
configs with `use_sliding_window` on some): `config.layer_sliding_window(i)`, passed to the
attention kernels.
There is no batch dimension: the tokens of all requests in a step are concatenated into
`[num_tokens]`, and `AttentionMetadata` says where each request's tokens and cache blocks are.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from pagedrt.config import ModelConfig
from pagedrt.distributed.group import SINGLE_RANK, TPGroup
from pagedrt.models.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
)
from pagedrt.ops.attention import AttentionMetadata, KVCacheLayer, paged_attention, uses_triton

# Hugging Face projection name -> (our fused parameter, shard id)
_STACKED_PARAMS = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    """Multi-head attention with GQA and RoPE; K/V go through the paged cache. With
    `config.qk_norm`, `q_norm` and `k_norm` (RMSNorm, weight [head_dim]) normalise every query
    and key head before RoPE, as in Qwen3. With a TPGroup of N ranks it holds H / N query heads
    and their KV heads (pagedrt/distributed/sharding.py). Layer `layer_idx` attends over the
    window `config.layer_sliding_window(layer_idx)` (None: the whole sequence)."""

    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK,
                 layer_idx: int = 0) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.sliding_window = config.layer_sliding_window(layer_idx)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, config.head_dim, config.num_attention_heads,
            config.num_key_value_heads, bias=config.attention_bias, tp=tp,
        )
        self.num_heads = self.qkv_proj.num_heads  # of this tensor-parallel rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * config.head_dim, config.hidden_size, bias=False, tp=tp
        )
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta,
            config.rope_scaling,
        )
        self.scale = config.head_dim**-0.5
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        hidden_states: torch.Tensor,  # [T, hidden_size]
        kv_cache: KVCacheLayer | tuple[torch.Tensor, torch.Tensor],  # (k_cache, v_cache[,
        # k_scales, v_scales]): 2 x [num_blocks, block_size, kv_heads, d] (+ FP8 scales)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden_size]
        return self.o_proj(self.attention(positions, self.qkv_proj(hidden_states), kv_cache,
                                          meta))

    def forward_normed(
        self,
        norm: RMSNorm,
        positions: torch.Tensor,  # [T] int64
        x: torch.Tensor,  # [T, hidden_size]
        residual: torch.Tensor | None,
        kv_cache: KVCacheLayer | tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(self(positions, norm(x + residual), ...), x + residual)`
        (without a residual, norm(x) and x). For 1 to 4 CUDA rows the norm runs in the QKV
        projection's kernel (`RMSNorm.forward_linear`), and RoPE and the K/V cache write in its
        epilogue too (`pagedrt.ops.gemv_rope_triton`; PAGEDRT_FUSED_ROPE=0 turns that off),
        where timed faster (docs/design.md, "Small-batch decode"); for 8 to 128 rows see
        `attention_of_normed`."""
        if self._rope_fusion(norm, x, kv_cache, meta):
            qkv, residual = self._qkv_rope(norm, positions, x, residual, kv_cache, meta)
            return self.o_proj(self.attention(positions, qkv, kv_cache, meta, True)), residual
        if x.shape[0] <= 4:  # the norm in the QKV kernel, where timed faster
            qkv, residual = norm.forward_linear(x, residual, self.qkv_proj)
            return self.o_proj(self.attention(positions, qkv, kv_cache, meta)), residual
        h, residual = norm.forward_pair(x, residual)
        return self.o_proj(self.attention_of_normed(positions, h, kv_cache, meta)), residual

    def attention_of_normed(self, positions: torch.Tensor, h: torch.Tensor, kv_cache,
                            meta: AttentionMetadata) -> torch.Tensor:
        """`attention(positions, qkv_proj(h), kv_cache, meta)` for the normed input h
        [T, hidden_size]. For 8-128 CUDA rows the QKV matmul does RoPE and the K/V write in
        its epilogue (`pagedrt.ops.matmul_rope_triton`) where timed faster than the matmul
        and the rotary kernel, with PAGEDRT_FUSED_ROPE on (the default), a cache in the
        model's dtype, the Triton backend and no per-head q/k norm."""
        from pagedrt.models import layers

        if not (layers._decode_matmul(h) and self._rope_in_qkv(h, kv_cache, meta)):
            return self.attention(positions, self.qkv_proj(h), kv_cache, meta)
        from pagedrt.ops.matmul_rope_triton import linear_qkv_rope

        k_cache, v_cache = KVCacheLayer(*kv_cache)[:2]

        def plain() -> tuple[torch.Tensor, bool]:
            qkv = self.qkv_proj(h)
            return qkv, self.rotary_emb.forward_and_write_kv(
                positions, *self._heads(qkv), k_cache, v_cache, meta.slot_mapping,
                meta.backend)

        qkv, rotated = linear_qkv_rope(h, self.qkv_proj.weight, self.qkv_proj.bias, positions,
                                       self.rotary_emb.cos_sin_cache, k_cache, v_cache,
                                       meta.slot_mapping, self.num_heads, self.num_kv_heads,
                                       plain)
        return self.attention(positions, qkv, kv_cache, meta, rotated)

    def _rope_fusion(self, norm: RMSNorm, x: torch.Tensor, kv_cache, meta) -> bool:
        """Whether `_qkv_rope` may run: 1-4 CUDA rows of the small-batch kernels and
        `_rope_in_qkv`."""
        from pagedrt.models import layers

        return (layers._small_batch_fusion(x, norm.weight, self.qkv_proj.weight)
                and self._rope_in_qkv(x, kv_cache, meta))

    def _rope_in_qkv(self, x: torch.Tensor, kv_cache, meta: AttentionMetadata) -> bool:
        """Whether RoPE and the K/V write may run in the QKV projection's epilogue (either
        kernel: 1-4 or 8-128 rows): PAGEDRT_FUSED_ROPE on, no per-head q/k norm, a cache in
        x's dtype (not FP8), the Triton attention backend."""
        from pagedrt.ops import gemv_rope_triton

        return (gemv_rope_triton.ENABLED and self.q_norm is None
                and KVCacheLayer(*kv_cache).k_cache.dtype == x.dtype
                and uses_triton(meta.backend, x))

    def _qkv_rope(self, norm, positions, x, residual, kv_cache, meta):
        """(qkv with q and k rotated, the new residual), the K/V written: one kernel or the
        plain chain, whichever was timed faster for the shape (`fused_or_unfused`)."""
        from pagedrt.ops.gemv_rope_triton import CONFIGS, qkv_rope_triton
        from pagedrt.ops.gemv_triton import fused_or_unfused

        k_cache, v_cache = KVCacheLayer(*kv_cache)[:2]
        weight, bias = self.qkv_proj.weight, self.qkv_proj.bias

        def unfused():
            qkv, new_residual = norm.forward_linear(x, residual, self.qkv_proj)
            self.rotary_emb.forward_and_write_kv(positions, *self._heads(qkv), k_cache,
                                                 v_cache, meta.slot_mapping, meta.backend)
            return qkv, new_residual

        def fused(cfg):
            qkv, new_residual = qkv_rope_triton(
                x, weight, bias, positions, self.rotary_emb.cos_sin_cache, k_cache, v_cache,
                meta.slot_mapping, self.num_heads, self.num_kv_heads,
                (residual, norm.weight, norm.eps), cfg)
            return qkv, (x if new_residual is None else new_residual)

        key = ("qkv_rope", tuple(weight.shape), x.shape[0], x.dtype, bias is not None,
               residual is not None, x.device.index)
        return fused_or_unfused(key, unfused, fused, weight, x.shape[0], bias is not None,
                                candidates=CONFIGS)

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of qkv [T, (num_heads + 2 * num_kv_heads) * head_dim]: q [T, num_heads,
        head_dim], k and v [T, num_kv_heads, head_dim]."""
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        return (q.view(-1, self.num_heads, self.head_dim),
                k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))

    def attention(
        self,
        positions: torch.Tensor,  # [T] int64
        qkv: torch.Tensor,  # [T, (num_heads + 2 * num_kv_heads) * head_dim], qkv_proj's output
        kv_cache: KVCacheLayer | tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        rotated: bool = False,
    ) -> torch.Tensor:  # [T, num_heads * head_dim]
        """The attention after the QKV projection and before the O projection (the decoder
        layer may fuse the projections with the norms around them): RoPE, the K/V write and
        paged attention; with `rotated`, q and k in qkv are rotated and K/V written already
        (`_qkv_rope`)."""
        q, k, v = self._heads(qkv)
        if self.q_norm is not None:  # per head: rows of [T * heads, head_dim]
            q = self.q_norm(q.reshape(-1, self.head_dim)).view_as(q)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view_as(k)
        k_cache, v_cache, k_scales, v_scales = KVCacheLayer(*kv_cache)
        # on CUDA one kernel rotates q and k and writes k and v (quantized, into an FP8 cache)
        kv_written = rotated or self.rotary_emb.forward_and_write_kv(
            positions, q, k, v, k_cache, v_cache, meta.slot_mapping, meta.backend,
            k_scales=k_scales, v_scales=v_scales)
        if not kv_written:
            q, k = self.rotary_emb(positions, q, k)
        out = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale,
                              kv_written, self.sliding_window, k_scales,
                              v_scales)  # [T, heads, d]
        return out.flatten(1)


class LlamaMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False, tp=tp
        )
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, tp=tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """down(silu(gate) * up) of gate_up_proj's output [T, 2 * intermediate]; one kernel for
        1 to 4 CUDA rows (RowParallelLinear.forward_silu_mul)."""
        return self.down_proj.forward_silu_mul(gate_up, self.act_fn)

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(self(norm(x + residual)), x + residual)`, x and residual [T, hidden_size], with
        fewer kernels on CUDA where timed faster: for 1 to 4 rows the add and norm run in
        gate/up's kernel and the activation in down's (`RMSNorm.forward_linear`, `down`), for
        8 to 128 rows the activation in gate/up's epilogue
        (`MergedColumnParallelLinear.silu_mul_of`); docs/design.md, "Small-batch decode" and
        "Decode matmuls (8 to 128 rows)"."""
        if x.shape[0] <= 4:
            gate_up, residual = norm.forward_linear(x, residual, self.gate_up_proj)
            return self.down(gate_up), residual
        h, residual = norm(x, residual)
        return self.down_proj(self.gate_up_proj.silu_mul_of(h, self.act_fn)), residual


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block. The residual stream is carried separately so that each RMSNorm can fuse
    the add of the previous sub-block's output into itself."""

    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK,
                 layer_idx: int = 0) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, tp, layer_idx)
        self.mlp = LlamaMLP(config, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCacheLayer,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # each norm with the projection after it: one kernel each for small CUDA batches
        hidden_states, residual = self.self_attn.forward_normed(
            self.input_layernorm, positions, hidden_states, residual, kv_cache, meta)
        return self.mlp.forward_normed(self.post_attention_layernorm, hidden_states, residual)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, tp, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCacheLayer],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden_states, residual = layer(positions, hidden_states, residual, kv_cache, meta)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """Llama / Qwen2 / Qwen3 / Mistral causal LM. Parameters are created uninitialised
    (`torch.empty`) in the current default dtype and device; fill them with `load_weights`.
    `tp`: the tensor-parallel group; this process then holds its rank's shard of every layer
    and runs the forward together with the other ranks."""

    NORM_IDENTITY = 1.0  # the RMSNorm weight that leaves x / rms(x) unchanged (random weights)

    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        self.model = LlamaModel(config, tp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCacheLayer],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Run the decoder over one step's packed tokens, writing their K/V into the cache.

        Args:
            input_ids: [T] int64, the new tokens of all sequences, concatenated.
            positions: [T] int64, position of each token in its sequence.
            kv_caches: one `KVCacheLayer` (or (k_cache, v_cache) pair) per layer, each cache
                [num_blocks, block_size, num_kv_heads, head_dim] in the model dtype, or
                float8_e4m3fn with its scales (`pagedrt.ops.fp8`).
            meta: slot_mapping, block tables, seq_lens and cu_seqlens_q of this step.
        Returns:
            [T, hidden_size] final hidden states (after the last norm), model dtype.
        """
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [N, hidden_size] -> logits [N, vocab_size] in the model's dtype (the
        sampler upcasts to float32 where it computes probabilities; a greedy argmax needs no
        cast, which saves writing [N, vocab] float32 every decode step)."""
        return self.lm_head(hidden_states)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors into the (fused, sharded) parameters.

        q/k/v_proj go into qkv_proj and gate/up_proj into gate_up_proj through their
        `weight_loader`; rotary `inv_freq` buffers are skipped, and so is `lm_head.weight`
        when the embeddings are tied. Returns the names of the parameters that were loaded.

        Raises:
            ValueError: a tensor name matches no parameter, or a parameter received nothing.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            shard_id = None
            for hf_name, (fused_name, fused_shard) in _STACKED_PARAMS.items():
                if f".{hf_name}." in name:
                    name, shard_id = name.replace(hf_name, fused_name), fused_shard
                    break
            param = params.get(name)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} matches no parameter of the model")
            loader = getattr(param, "weight_loader", None)
            if loader is not None:
                loader(param, tensor, shard_id)
            else:
                assert param.shape == tensor.shape, f"{name}: {param.shape} vs {tensor.shape}"
                param.data.copy_(tensor)
            loaded.add(name)
        missing = set(params) - loaded
        if self.config.tie_word_embeddings:
            missing.discard("lm_head.weight")
        if missing:
            raise ValueError(f"checkpoint lacks weights for {sorted(missing)[:5]} ...")
        return loaded

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The inverse of `load_weights` for a model on one rank: every parameter under its
        Hugging Face name, qkv_proj and gate_up_proj split back into their projections (views
        of this model's tensors; `lm_head.weight` included even when tied)."""
        assert self.tp.size == 1, f"a shard of rank {self.tp.rank} is not the whole model"
        cfg = self.config
        q = cfg.num_attention_heads * cfg.head_dim
        kv = cfg.num_key_value_heads * cfg.head_dim
        out = {}
        for name, p in self.state_dict().items():
            if ".qkv_proj." in name:
                base, kind = name.split(".qkv_proj.")
                for part, t in zip(("q_proj", "k_proj", "v_proj"), p.split([q, kv, kv])):
                    out[f"{base}.{part}.{kind}"] = t
            elif ".gate_up_proj." in name:
                base, kind = name.split(".gate_up_proj.")
                gate, up = p.chunk(2, dim=0)
                out[f"{base}.gate_proj.{kind}"] = gate
                out[f"{base}.up_proj.{kind}"] = up
            elif "rotary_emb" not in name:
                out[name] = p
        return out

    @staticmethod
    def hf_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor of a Hugging Face checkpoint of this architecture
        (what `load_weights` expects; no lm_head.weight when the embeddings are tied)."""
        hidden, d, inter = config.hidden_size, config.head_dim, config.intermediate_size
        q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (config.vocab_size, hidden)}
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (hidden,)
            for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                shapes[f"{p}self_attn.{proj}.weight"] = (rows, hidden)
                if config.attention_bias:
                    shapes[f"{p}self_attn.{proj}.bias"] = (rows,)
            if config.qk_norm:
                shapes[p + "self_attn.q_norm.weight"] = (d,)
                shapes[p + "self_attn.k_norm.weight"] = (d,)
            shapes[p + "self_attn.o_proj.weight"] = (hidden, q)
            shapes[p + "post_attention_layernorm.weight"] = (hidden,)
            shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
            shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
            shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        shapes["model.norm.weight"] = (hidden,)
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (config.vocab_size, hidden)
        return shapes
