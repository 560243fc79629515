"""Gemma 3 text decoder (`Gemma3ForCausalLM`) over packed tokens and a paged KV cache.

What differs from the Llama network of `pagedrt.models.llama`, each as Hugging Face's
implementation computes it (checked against it in tests/test_models_window.py):

  * local and global layers: `config.layer_types` (five sliding layers, then one full, in the
    published checkpoints); a sliding layer attends over the last `config.sliding_window`
    positions and rotates with RoPE base `rope_local_theta` (10k), a global layer attends to
    the whole sequence with base `rope_theta` (1M) and the config's RoPE scaling;
  * RMSNorm scales by (1 + w), in fp32 before the cast back (`GemmaRMSNorm`); the query and
    key heads go through one each before RoPE;
  * four norms per layer: before and after attention, before and after the MLP
    ("sandwich"); the residual is added after the post-norms;
  * embeddings scaled by sqrt(hidden_size), rounded to the model dtype first;
  * MLP gate activation GELU with the tanh approximation;
  * softmax scale query_pre_attn_scalar ** -0.5 (256 in the published configs).

The embedding, LM head and weight loading are Llama's (`LlamaForCausalLM`); the LM head is
tied to the embedding in every published Gemma 3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedrt.config import ModelConfig
from pagedrt.distributed.group import SINGLE_RANK, TPGroup
from pagedrt.models.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from pagedrt.models.llama import LlamaForCausalLM
from pagedrt.ops.attention import AttentionMetadata, KVCacheLayer, paged_attention


class GemmaRMSNorm(nn.Module):
    """RMSNorm with a zero-centred weight: x / rms(x) * (1 + w), all in fp32, cast once.

    `forward(x)` returns the normed x; `forward(x, residual)` first sets
    `residual = x + residual` (in x's dtype) and returns `(norm(residual), residual)`.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [..., hidden_size]."""
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual


class Gemma3Attention(nn.Module):
    """GQA attention with per-head q/k norms, RoPE of the layer's kind (local or global) and,
    on local layers, a sliding window; K/V go through the paged cache."""

    def __init__(self, config: ModelConfig, layer_idx: int, rotary_emb: RotaryEmbedding,
                 tp: TPGroup = SINGLE_RANK) -> None:
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
            config.num_attention_heads * config.head_dim, config.hidden_size,
            bias=config.attention_bias, tp=tp,
        )
        self.rotary_emb = rotary_emb  # shared by the layers of one kind
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,  # [T] int64
        hidden_states: torch.Tensor,  # [T, hidden_size]
        kv_cache: KVCacheLayer,  # 2 x [num_blocks, block_size, kv_heads, d] (+ FP8 scales)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden_size]
        qkv = self.qkv_proj(hidden_states)  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.num_heads, self.head_dim))  # [T, heads, head_dim]
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_dim))
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        k_cache, v_cache, k_scales, v_scales = KVCacheLayer(*kv_cache)
        # on CUDA one kernel rotates q and k and writes k and v (quantized, into an FP8 cache)
        kv_written = self.rotary_emb.forward_and_write_kv(
            positions, q, k, v, k_cache, v_cache, meta.slot_mapping, meta.backend,
            k_scales=k_scales, v_scales=v_scales)
        if not kv_written:
            q, k = self.rotary_emb(positions, q, k)
        out = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, kv_written,
                              self.sliding_window, k_scales, v_scales)  # [T, heads, head_dim]
        return self.o_proj(out.flatten(1))


class Gemma3MLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False, tp=tp
        )
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, tp=tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma3DecoderLayer(nn.Module):
    """Sandwich-norm block. The residual stream is carried separately, as in Llama's layer:
    the layer returns (mlp branch after its post-norm, residual before that branch is added),
    and the next layer's input norm (or the final norm) adds them."""

    def __init__(self, config: ModelConfig, layer_idx: int, rotary_emb: RotaryEmbedding,
                 tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = Gemma3Attention(config, layer_idx, rotary_emb, tp)
        self.mlp = Gemma3MLP(config, tp)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, kv_cache, meta)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return self.post_feedforward_layernorm(hidden_states), residual


class Gemma3Model(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        # one RoPE table per kind of layer, shared (a [max_position, head_dim] fp32 table each)
        global_rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                      config.rope_theta, config.rope_scaling)
        local_rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                     config.rope_local_theta or config.rope_theta)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(config, i, local_rope if config.layer_sliding_window(i)
                               else global_rope, tp)
            for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embed_scale = config.hidden_size**0.5

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        # the scale is rounded to the model dtype first (sqrt(1152) = 33.94 is 34.0 in bf16)
        scale = float(torch.tensor(self.embed_scale, dtype=hidden_states.dtype))
        hidden_states = hidden_states * scale
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden_states, residual = layer(positions, hidden_states, residual, kv_cache, meta)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 causal LM (text only). Parameters are created uninitialised in the current
    default dtype and device; fill them with `load_weights` (Hugging Face names, as Llama's:
    q/k/v_proj into qkv_proj, gate/up_proj into gate_up_proj). `forward`, `compute_logits`,
    `load_weights` and `hf_state_dict` are Llama's, over `Gemma3Model`; `tp` as Llama's."""

    NORM_IDENTITY = 0.0  # (1 + w) norms

    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE_RANK) -> None:
        nn.Module.__init__(self)  # Llama's __init__ would build Llama's decoder
        self.config = config
        self.tp = tp
        self.model = Gemma3Model(config, tp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def hf_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Llama's checkpoint shapes plus the norms before and after each MLP (q/k norms are
        there since `config.qk_norm` is set for Gemma 3)."""
        shapes = LlamaForCausalLM.hf_weight_shapes(config)
        for i in range(config.num_hidden_layers):
            for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                shapes[f"model.layers.{i}.{name}.weight"] = (config.hidden_size,)
        return shapes
