"""Frozen, validated configuration objects.

`ModelConfig` describes the network (read from a Hugging Face config.json or GGUF metadata);
`EngineConfig` describes how the engine runs it (KV cache size, batching limits, devices).
Both validate in `__post_init__` and raise `ValueError` naming the bad value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder (Llama, Qwen2).

    Attributes:
        architecture: "LlamaForCausalLM" or "Qwen2ForCausalLM".
        vocab_size: number of token ids (rows of the embedding).
        hidden_size: model width.
        intermediate_size: width of the SwiGLU MLP.
        num_hidden_layers: decoder layers.
        num_attention_heads: query heads.
        num_key_value_heads: KV heads (GQA when smaller than num_attention_heads; it must
            divide it).
        head_dim: width of one head; hidden_size // num_attention_heads unless the config says.
        rms_norm_eps: epsilon of RMSNorm.
        rope_theta: RoPE base frequency (Su et al. 2021, "RoFormer").
        max_position_embeddings: longest context the model was trained for, in tokens.
        tie_word_embeddings: the LM head reuses the embedding matrix.
        attention_bias: q/k/v projections have a bias (Qwen2: True).
        bos_token_id, eos_token_ids: special token ids (eos may be several).
        rope_scaling: the config's rope_scaling dict (Llama-3 style "llama3" is supported), or None.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; pagedrt runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @property
    def num_queries_per_kv(self) -> int:
        """GQA group size: query heads served by one KV head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        """Build from a Hugging Face config.json dictionary.

        Raises:
            ValueError: the architecture is not Llama or Qwen2, or a field is missing.
        """
        archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r} in config.json; pagedrt runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            num_heads = cfg["num_attention_heads"]
            hidden = cfg["hidden_size"]
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
            rope_theta = cfg.get("rope_theta")
            rope_params = cfg.get("rope_parameters") or {}
            if rope_theta is None:
                rope_theta = rope_params.get("rope_theta", 10000.0)
            rope_scaling = cfg.get("rope_scaling")
            if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
                rope_scaling = rope_params
            return cls(
                architecture=arch,
                vocab_size=cfg["vocab_size"],
                hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"],
                num_hidden_layers=cfg["num_hidden_layers"],
                num_attention_heads=num_heads,
                num_key_value_heads=cfg.get("num_key_value_heads") or num_heads,
                head_dim=cfg.get("head_dim") or hidden // num_heads,
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=float(rope_theta),
                max_position_embeddings=cfg.get("max_position_embeddings", 2048),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                rope_scaling=rope_scaling,
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks the field {e.args[0]!r}") from None


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model.

    Attributes:
        block_size: tokens per KV block (8, 16 or 32; 16 by default as in vLLM).
        num_kv_blocks: explicit number of KV blocks; overrides the memory budgets below.
        kv_cache_memory_bytes: KV budget in bytes on CPU (all layers, K and V).
        gpu_memory_utilization: on CUDA, fraction of total device memory the whole process may
            use; the KV cache gets what is left of it after weights and activations.
        max_num_seqs: most requests in one step.
        max_num_batched_tokens: most tokens (new query tokens, all requests) in one step; long
            prompts are split into chunks (chunked prefill) to fit.
        max_model_len: longest sequence (prompt + output) in tokens; None = the model's
            max_position_embeddings.
        enable_prefix_caching: reuse KV blocks of identical prefixes (hash chain of full blocks).
        preemption_mode: "recompute" or "swap" when the KV cache runs out.
        swap_space_bytes: size of the pinned CPU pool for swapped-out blocks.
        enforce_eager: disable CUDA graphs.
        async_scheduling: overlap the host work of step n+1 (schedule, prepare, launch) with
            the device running step n; tokens reach the host one step later. None = on for
            CUDA, off on CPU (where the model runs on the host anyway), unless the
            environment variable PAGEDRT_ASYNC_SCHEDULING is set to 1 or 0.
        attention_backend: "auto" (Triton on CUDA, torch on CPU), "torch" or "triton".
        seed: seed of the engine's default generator (unseeded requests).
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 1 << 30
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    swap_space_bytes: int = 1 << 30
    enforce_eager: bool = False
    async_scheduling: bool | None = None
    attention_backend: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32):
            raise ValueError(f"block_size={self.block_size} is not supported; use 8, 16 or 32")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks} must be >= 1 (or None)")
        if self.kv_cache_memory_bytes < 1:
            raise ValueError(f"kv_cache_memory_bytes={self.kv_cache_memory_bytes} must be > 0")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len={self.max_model_len} must be >= 1 (or None)")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(
                f"preemption_mode={self.preemption_mode!r}; use 'recompute' or 'swap'"
            )
        if self.swap_space_bytes < 0:
            raise ValueError(f"swap_space_bytes={self.swap_space_bytes} must be >= 0")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend={self.attention_backend!r}; use 'auto', 'torch' or 'triton'"
            )
