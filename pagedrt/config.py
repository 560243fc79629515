"""Frozen, validated configuration objects.

`ModelConfig` describes the network (read from a Hugging Face config.json or GGUF metadata);
`EngineConfig` describes how the engine runs it (KV cache size, batching limits, devices).
Both validate in `__post_init__` and raise `ValueError` naming the bad value and the fix.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, fields

from pagedrt.models.registry import supported_architectures
from pagedrt.spec.config import SpeculativeConfig

SUPPORTED_ARCHITECTURES = supported_architectures()  # the keys of models.registry.MODEL_REGISTRY


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder (Llama, Qwen2, Qwen3, Mistral without sliding window).

    Attributes:
        architecture: a key of `pagedrt.models.registry.MODEL_REGISTRY` (SUPPORTED_ARCHITECTURES):
            "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM" or "MistralForCausalLM".
        vocab_size: number of token ids (rows of the embedding).
        hidden_size: model width.
        intermediate_size: width of the SwiGLU MLP.
        num_hidden_layers: decoder layers.
        num_attention_heads: query heads.
        num_key_value_heads: KV heads (GQA when smaller than num_attention_heads; it must
            divide it).
        head_dim: width of one head; hidden_size // num_attention_heads unless the config says
            (Qwen3 sets it independently: Qwen3-0.6B has 16 heads of 128 over hidden 1024).
        rms_norm_eps: epsilon of RMSNorm.
        rope_theta: RoPE base frequency (Su et al. 2021, "RoFormer").
        max_position_embeddings: longest context the model was trained for, in tokens.
        tie_word_embeddings: the LM head reuses the embedding matrix.
        attention_bias: q/k/v projections have a bias (Qwen2: True).
        qk_norm: each query and key head goes through its own RMSNorm over head_dim (weights
            `self_attn.q_norm` / `self_attn.k_norm`, [head_dim]) before RoPE (Qwen3: True).
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
    qk_norm: bool = False
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
            ValueError: the architecture is not in SUPPORTED_ARCHITECTURES, the config asks for
                sliding-window attention, or a field is missing.
        """
        archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r} in config.json; pagedrt runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        _reject_sliding_window(arch, cfg)
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
                qk_norm=arch == "Qwen3ForCausalLM",
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                rope_scaling=rope_scaling,
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks the field {e.args[0]!r}") from None


def _reject_sliding_window(arch: str, cfg: dict) -> None:
    """Raise if the config makes any layer attend over a sliding window (the paged attention
    kernels and the KV manager attend over the whole sequence).

    Mistral applies `sliding_window` to every layer unless it is null; a window at least
    `max_position_embeddings` long never cuts anything and is accepted. Qwen2/Qwen3 apply it
    only with `use_sliding_window`, to the layers marked "sliding_attention" in `layer_types`
    (older configs: layers from `max_window_layers` on).
    """
    window = cfg.get("sliding_window")
    max_pos = cfg.get("max_position_embeddings", 2048)
    layer_types = cfg.get("layer_types") or []
    if arch == "MistralForCausalLM":
        sliding = window is not None and window < max_pos
    elif layer_types:
        sliding = "sliding_attention" in layer_types
    else:
        sliding = (bool(cfg.get("use_sliding_window")) and window is not None
                   and cfg.get("max_window_layers", 0) < cfg.get("num_hidden_layers", 0))
    if sliding:
        raise ValueError(
            f"{arch} config with sliding_window={window} (max_position_embeddings={max_pos}): "
            "sliding-window attention is not supported yet (the attention kernels attend over "
            "the whole sequence); pagedrt runs only configs without a window (sliding_window "
            "null or >= max_position_embeddings; for Qwen, use_sliding_window false)"
        )


BLOCK_SIZES = (8, 16, 32)
PREEMPTION_MODES = ("recompute", "swap")
ATTENTION_BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model.

    This is the one list of engine options: `LLM(**options)` takes these fields, and the
    `pagedrt` command has one option per field (`pagedrt.entrypoints.engine_args` makes them
    from the fields). Each field's metadata holds its "help" text and, where needed, its
    "choices" and its command-line "flags" (default: --field-name). The Attributes section
    below is made from the help texts.
    """

    block_size: int = field(default=16, metadata={
        "help": "tokens per KV block", "choices": BLOCK_SIZES})
    num_kv_blocks: int | None = field(default=None, metadata={
        "help": "explicit number of KV blocks; overrides the memory budgets below"})
    kv_cache_memory_bytes: int = field(default=1 << 30, metadata={
        "help": "KV budget in bytes on CPU (all layers, K and V)"})
    gpu_memory_utilization: float = field(default=0.9, metadata={
        "help": "on CUDA, fraction of total device memory the whole process may use; the KV "
                "cache gets what is left of it after weights and activations"})
    max_num_seqs: int = field(default=256, metadata={"help": "most requests in one step"})
    max_num_batched_tokens: int = field(default=8192, metadata={
        "help": "most tokens (new query tokens, all requests) in one step; long prompts are "
                "split into chunks (chunked prefill) to fit"})
    max_model_len: int | None = field(default=None, metadata={
        "help": "longest sequence (prompt + output) in tokens; None = the model's "
                "max_position_embeddings"})
    enable_prefix_caching: bool = field(default=True, metadata={
        "help": "reuse KV blocks of identical prefixes (hash chain of full blocks)",
        "flags": ("--enable-prefix-caching", "--prefix-caching")})
    preemption_mode: str = field(default="recompute", metadata={
        "help": "what to do with a request when the KV cache runs out",
        "choices": PREEMPTION_MODES})
    swap_space_bytes: int = field(default=1 << 30, metadata={
        "help": "size of the pinned CPU pool for swapped-out blocks"})
    enforce_eager: bool = field(default=False, metadata={"help": "disable CUDA graphs"})
    async_scheduling: bool | None = field(default=None, metadata={
        "help": "overlap the host work of step n+1 (schedule, prepare, launch) with the device "
                "running step n; tokens reach the host one step later. None = on for CUDA, off "
                "on CPU (where the model runs on the host anyway), unless the environment "
                "variable PAGEDRT_ASYNC_SCHEDULING is set to 1 or 0"})
    attention_backend: str = field(default="auto", metadata={
        "help": "attention kernels; auto = Triton on CUDA, torch on CPU",
        "choices": ATTENTION_BACKENDS})
    seed: int = field(default=0, metadata={
        "help": "seed of the engine's default generator, used by requests without a seed",
        "flags": ("--engine-seed",)})  # `pagedrt generate --seed` is the per-request seed
    speculative_config: dict | None = field(default=None, hash=False, metadata={
        "help": "speculative decoding with vLLM's names, e.g. {\"method\": \"ngram\", "
                "\"num_speculative_tokens\": 5, \"prompt_lookup_min\": 2, "
                "\"prompt_lookup_max\": 4} or {\"method\": \"draft_model\", \"model\": PATH, "
                "\"num_speculative_tokens\": 4}; optional \"disable_by_batch_size\" (32): "
                "speculate only while at most that many sequences are unfinished (a JSON object "
                "on the command line; pagedrt.spec.config.SpeculativeConfig)"})

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
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
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode={self.preemption_mode!r}; use 'recompute' or 'swap'"
            )
        if self.swap_space_bytes < 0:
            raise ValueError(f"swap_space_bytes={self.swap_space_bytes} must be >= 0")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend={self.attention_backend!r}; use 'auto', 'torch' or 'triton'"
            )
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)  # raises ValueError if bad

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """`speculative_config` parsed and validated, or None (no speculative decoding)."""
        if self.speculative_config is None:
            return None
        return SpeculativeConfig.from_dict(self.speculative_config)


def _attributes_section(cls: type) -> str:
    """A Google-style Attributes section made from each field's metadata["help"]."""
    lines = ["", "    Attributes:"]
    for f in fields(cls):
        text = f.metadata["help"]
        if "choices" in f.metadata:
            text += "; one of " + ", ".join(repr(c) for c in f.metadata["choices"])
        lines += textwrap.wrap(f"{f.name}: {text} (default {f.default!r}).", width=96,
                               initial_indent=" " * 8, subsequent_indent=" " * 12)
    return "\n".join(lines) + "\n"


if EngineConfig.__doc__:  # None under python -OO
    EngineConfig.__doc__ = EngineConfig.__doc__.rstrip() + "\n" + _attributes_section(EngineConfig)
