"""Frozen, validated configuration objects.

`ModelConfig` describes the network (read from a Hugging Face config.json or GGUF metadata);
`EngineConfig` describes how the engine runs it (KV cache size, batching limits, devices).
Both validate in `__post_init__` and raise `ValueError` naming the bad value and the fix.
"""

from __future__ import annotations

import numbers
import textwrap
from dataclasses import dataclass, field, fields, replace

from pagedrt.models.registry import supported_architectures
from pagedrt.spec.config import SpeculativeConfig

SUPPORTED_ARCHITECTURES = supported_architectures()  # the keys of models.registry.MODEL_REGISTRY


LAYER_TYPES = ("full_attention", "sliding_attention")  # Hugging Face's names


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder of the supported families (Llama, Qwen2, Qwen3, Mistral, Gemma 3).

    Attributes:
        architecture: a key of `pagedrt.models.registry.MODEL_REGISTRY` (SUPPORTED_ARCHITECTURES):
            "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM" or
            "Gemma3ForCausalLM".
        vocab_size: number of token ids (rows of the embedding).
        hidden_size: model width.
        intermediate_size: width of the gated MLP (SwiGLU; GELU-tanh for Gemma 3).
        num_hidden_layers: decoder layers.
        num_attention_heads: query heads.
        num_key_value_heads: KV heads (GQA when smaller than num_attention_heads; it must
            divide it).
        head_dim: width of one head; hidden_size // num_attention_heads unless the config says
            (Qwen3 sets it independently: Qwen3-0.6B has 16 heads of 128 over hidden 1024).
        rms_norm_eps: epsilon of RMSNorm.
        rope_theta: RoPE base frequency (Su et al. 2021, "RoFormer"); for Gemma 3, that of the
            full-attention (global) layers.
        max_position_embeddings: longest context the model was trained for, in tokens.
        tie_word_embeddings: the LM head reuses the embedding matrix.
        attention_bias: q/k/v projections have a bias (Qwen2: True).
        qk_norm: each query and key head goes through its own RMSNorm over head_dim (weights
            `self_attn.q_norm` / `self_attn.k_norm`, [head_dim]) before RoPE (Qwen3, Gemma 3).
        bos_token_id, eos_token_ids: special token ids (eos may be several).
        rope_scaling: the config's rope_scaling dict ("llama3" and "linear" are supported), or
            None; for Gemma 3 it applies to the global layers only.
        sliding_window: window of the sliding-attention layers in tokens: a query at position p
            sees keys p - sliding_window + 1 .. p. None when no layer has one.
        layer_types: per layer "full_attention" or "sliding_attention" (Hugging Face's
            `layer_types`); empty means every layer is full. Mistral with a window: every layer
            sliding; Gemma 3: five sliding layers, then one full, repeated.
        rope_local_theta: RoPE base of the sliding layers when it differs from rope_theta
            (Gemma 3: 10000, against 1e6 for its global layers); None = rope_theta.
        query_pre_attn_scalar: the softmax scale is query_pre_attn_scalar ** -0.5 (Gemma 3);
            None = head_dim ** -0.5.
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
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    rope_local_theta: float | None = None
    query_pre_attn_scalar: int | None = None

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
        if self.layer_types:
            if len(self.layer_types) != self.num_hidden_layers or not set(
                    self.layer_types) <= set(LAYER_TYPES):
                raise ValueError(
                    f"layer_types={self.layer_types!r}: give one of {LAYER_TYPES} per layer "
                    f"({self.num_hidden_layers}), or () for full attention everywhere")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding layers but sliding_window is None; "
                                 "set the window in tokens")
        if self.sliding_window is not None and (
                not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ValueError(f"ModelConfig.sliding_window={self.sliding_window!r}; give a "
                             "number of tokens >= 1, or None")

    @property
    def num_queries_per_kv(self) -> int:
        """GQA group size: query heads served by one KV head."""
        return self.num_attention_heads // self.num_key_value_heads

    def layer_sliding_window(self, layer: int) -> int | None:
        """The window of decoder layer `layer` in tokens, or None when it attends to the whole
        sequence."""
        if self.layer_types and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def kv_sliding_window(self) -> int | None:
        """The window when every layer is windowed, else None. Only then can the KV manager
        give back the blocks before it (no layer reads them again); with one full-attention
        layer every block stays (docs/design.md, "Sliding window")."""
        if self.layer_types and all(t == "sliding_attention" for t in self.layer_types):
            return self.sliding_window
        return None

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        """Build from a Hugging Face config.json dictionary.

        Raises:
            ValueError: the architecture is not in SUPPORTED_ARCHITECTURES, the config asks for
                something pagedrt does not run (Gemma 3 logit soft-capping, bidirectional
                attention, an activation other than GELU-tanh; attention_bias on an architecture
                other than Qwen2 and Gemma 3, mlp_bias), or a field is missing.
        """
        archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r} in config.json; pagedrt runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        gemma3 = arch == "Gemma3ForCausalLM"
        _refuse_biases(arch, cfg)
        try:
            num_heads = cfg["num_attention_heads"]
            hidden = cfg["hidden_size"]
            num_layers = cfg["num_hidden_layers"]
            max_pos = cfg.get("max_position_embeddings", 2048)
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
            window, layer_types = _sliding_layers(arch, cfg, num_layers, max_pos)
            if gemma3:
                extra = _gemma3_fields(cfg)
            else:
                extra = {"rope_theta": float(_rope_theta(cfg, cfg.get("rope_parameters"))),
                         "rope_scaling": _rope_scaling(cfg, cfg.get("rope_parameters"))}
            return cls(
                architecture=arch,
                vocab_size=cfg["vocab_size"],
                hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"],
                num_hidden_layers=num_layers,
                num_attention_heads=num_heads,
                num_key_value_heads=cfg.get("num_key_value_heads") or num_heads,
                head_dim=cfg.get("head_dim") or (256 if gemma3 else hidden // num_heads),
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                max_position_embeddings=max_pos,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma3)),
                attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
                qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                sliding_window=window,
                layer_types=layer_types,
                **extra,
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks the field {e.args[0]!r}") from None


def _refuse_biases(arch: str, cfg: dict) -> None:
    """Biases pagedrt's modules do not have: HF's `attention_bias` puts one on the o projection
    too (Llama, Mistral, Qwen3; Qwen2's q/k/v biases come without the field, Gemma 3 has the o
    bias), `mlp_bias` on gate, up and down. Refused here, by name, rather than by the weight
    loader's "matches no parameter" (a QA trial of 2026-12-07)."""
    if cfg.get("attention_bias") and arch not in ("Qwen2ForCausalLM", "Gemma3ForCausalLM"):
        raise ValueError(f"attention_bias=True (biases on the q/k/v and o projections) is not "
                         f"supported for {arch}; pagedrt runs these checkpoints without them")
    if cfg.get("mlp_bias"):
        raise ValueError(f"mlp_bias=True (biases on the gate, up and down projections) is not "
                         f"supported for {arch}; pagedrt runs these checkpoints without them")


def _rope_theta(cfg: dict, rope_params: dict | None, default: float = 10000.0) -> float:
    """rope_theta at the top level (older configs) or inside rope_parameters (newer ones)."""
    theta = cfg.get("rope_theta")
    return (rope_params or {}).get("rope_theta", default) if theta is None else theta


def _rope_scaling(cfg: dict, rope_params: dict | None) -> dict | None:
    """The config's rope_scaling, or rope_parameters when it names a non-default type."""
    scaling = cfg.get("rope_scaling")
    if scaling is None and (rope_params or {}).get("rope_type", "default") != "default":
        scaling = rope_params
    return scaling


def _sliding_layers(arch: str, cfg: dict, num_layers: int,
                    max_pos: int) -> tuple[int | None, tuple[str, ...]]:
    """(sliding_window, layer_types) as Hugging Face's implementation of `arch` reads them.

    Mistral: every layer attends over `sliding_window` unless it is null. Qwen2 / Qwen3: only
    with `use_sliding_window`, the layers marked "sliding_attention" in `layer_types` (older
    configs: those from `max_window_layers` on). Gemma 3: `layer_types`, or (older configs)
    every `sliding_window_pattern`-th layer full (default 6), the rest sliding. A window of at
    least max_position_embeddings never cuts anything and is dropped: those layers are full.
    """
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if arch == "MistralForCausalLM":
        layer_types = ["sliding_attention"] * num_layers
    elif arch == "Gemma3ForCausalLM":
        pattern = cfg.get("sliding_window_pattern", 6)
        layer_types = layer_types or [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(num_layers)]
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if not cfg.get("use_sliding_window"):
            window = None
        layer_types = layer_types or [
            "sliding_attention" if i >= cfg.get("max_window_layers", 28) else
            "full_attention" for i in range(num_layers)]
    else:
        window = None
    if window is None or window >= max_pos or "sliding_attention" not in (layer_types or ()):
        return None, ()
    return int(window), tuple(layer_types)


def _gemma3_fields(cfg: dict) -> dict:
    """Gemma 3's RoPE bases (global and local), scaling and query scale; refuses what pagedrt
    does not run."""
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(name) is not None:
            raise ValueError(f"Gemma 3 config with {name}={cfg[name]}: logit soft-capping is "
                             "not supported (Gemma 3 checkpoints set it to null)")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("Gemma 3 config with use_bidirectional_attention=true: pagedrt runs "
                         "causal decoders only")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"Gemma 3 config with hidden_activation={act!r}: pagedrt runs "
                         "'gelu_pytorch_tanh'")
    params = cfg.get("rope_parameters") or {}
    full, sliding = params.get("full_attention"), params.get("sliding_attention")
    local_theta = cfg.get("rope_local_base_freq")
    if local_theta is None:
        local_theta = (sliding or {}).get("rope_theta", 10000.0)
    if (sliding or {}).get("rope_type", "default") != "default":
        raise ValueError(f"Gemma 3 local RoPE type {sliding['rope_type']!r} is not supported")
    return {"rope_theta": float(_rope_theta(cfg, full, 1_000_000.0)),
            "rope_scaling": _rope_scaling(cfg, full),
            "rope_local_theta": float(local_theta),
            "query_pre_attn_scalar": int(cfg.get("query_pre_attn_scalar", 256))}


BLOCK_SIZES = (8, 16, 32)
PREEMPTION_MODES = ("recompute", "swap")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
KV_CACHE_DTYPES = ("auto", "fp8")
EXECUTOR_BACKENDS = ("auto", "uni", "mp")
# num_scheduler_steps=None ("auto"): this many passes while at most this many sequences
# decode, on CUDA with graphs (`resolve_multi_step`; docs/design.md, "Multi-step decode")
AUTO_SCHEDULER_STEPS = 8
AUTO_MULTI_STEP_MAX_NUM_SEQS = 32


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
        "help": "KV budget in bytes on CPU (all layers, K and V), per tensor-parallel rank"})
    gpu_memory_utilization: float = field(default=0.9, metadata={
        "help": "on CUDA, fraction of total device memory the whole process may use (each "
                "tensor-parallel rank: of its own GPU); the KV cache gets what is left of it "
                "after weights and activations"})
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
        "help": "size of the pinned CPU pool for swapped-out blocks, per tensor-parallel "
                "rank"})
    enforce_eager: bool = field(default=False, metadata={"help": "disable CUDA graphs"})
    async_scheduling: bool | None = field(default=None, metadata={
        "help": "overlap the host work of step n+1 (schedule, prepare, launch) with the device "
                "running step n; tokens reach the host one step later. None = on for CUDA, off "
                "on CPU (where the model runs on the host anyway), unless the environment "
                "variable PAGEDRT_ASYNC_SCHEDULING is set to 1 or 0"})
    num_scheduler_steps: int | None = field(default=None, metadata={
        "help": "multi-step decode: a steady decode step (every running sequence decoding, "
                "none waiting) runs up to this many forward passes and samples on the device "
                "before the host reads their tokens, each pass taking the last one's tokens "
                "as inputs on the device, so the host's per-step work (schedule, prepare, "
                "update) is paid once per this many tokens. Tokens reach the host and stream "
                "in groups of up to this many; tokens sampled after a stop are discarded. "
                "1 = off. At most block_size. Steps with beam search, speculative decoding or "
                "bad-word sequences run one pass. None (the default) = auto: on CUDA with CUDA "
                f"graphs, {AUTO_SCHEDULER_STEPS} passes while at most "
                f"{AUTO_MULTI_STEP_MAX_NUM_SEQS} "
                "sequences decode (the batches where the host's work shows), else 1; the "
                "server (pagedrt serve) defaults to 1, so that tokens stream one at a time "
                "(docs/design.md, \"Multi-step decode\")"})
    multi_step_max_num_seqs: int | None = field(default=None, metadata={
        "help": "multi-step decode only while the steady batch has at most this many "
                "sequences; a larger batch runs one pass a step. None = any batch (auto "
                f"num_scheduler_steps sets {AUTO_MULTI_STEP_MAX_NUM_SEQS})"})
    attention_backend: str = field(default="auto", metadata={
        "help": "attention kernels; auto = Triton on CUDA, torch on CPU",
        "choices": ATTENTION_BACKENDS})
    kv_cache_dtype: str = field(default="auto", metadata={
        "help": "element type of the KV cache: auto = the model's dtype; fp8 = float8 e4m3 "
                "with a float32 scale per token and KV head (about half the bytes per token, "
                "so about twice the blocks in the same memory; the model still computes in "
                "its own dtype; the Triton kernels need compute capability >= 8.9)",
        "choices": KV_CACHE_DTYPES})
    seed: int = field(default=0, metadata={
        "help": "seed of the engine's default generator, used by requests without a seed",
        "flags": ("--engine-seed",)})  # `pagedrt generate --seed` is the per-request seed
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "split the model over this many GPUs (CPU processes on CPU), one worker "
                "process each, Megatron-style; it must divide the attention heads and divide "
                "or be a multiple of the KV heads. Under torchrun it must equal WORLD_SIZE",
        "flags": ("--tensor-parallel-size", "-tp")})
    distributed_executor_backend: str = field(default="auto", metadata={
        "help": "where the model runs: 'uni' in the engine's process (tensor_parallel_size 1 "
                "only), 'mp' in worker processes (one per rank, also for 1), 'auto' = 'uni' "
                "for 1 and 'mp' for more; a process started by torchrun drives the other "
                "torchrun ranks whatever this says",
        "choices": EXECUTOR_BACKENDS})
    speculative_config: dict | None = field(default=None, hash=False, metadata={
        "help": "speculative decoding with vLLM's names, e.g. {\"method\": \"ngram\", "
                "\"num_speculative_tokens\": 5, \"prompt_lookup_min\": 2, "
                "\"prompt_lookup_max\": 4} or {\"method\": \"draft_model\", \"model\": PATH, "
                "\"num_speculative_tokens\": 4}; optional \"disable_by_batch_size\" (4): "
                "speculate only while at most that many sequences are unfinished, and "
                "\"min_mean_accepted_length\" (2.0): a sequence whose latest verification "
                "steps gave fewer tokens each than that on average pauses speculation, with "
                "exponential backoff (a JSON object "
                "on the command line; pagedrt.spec.config.SpeculativeConfig)"})

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_blocks", "kv_cache_memory_bytes", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len", "swap_space_bytes",
                     "multi_step_max_num_seqs", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, numbers.Integral)):
                raise ValueError(f"{name}={value!r} must be an int")
        if not -(2**63) <= self.seed < 2**63:  # (a request's seed's range, which torch takes)
            raise ValueError(f"seed={self.seed} must be in [-2**63, 2**63) (a 64-bit int)")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size={self.block_size!r} is not supported; use 8, 16 or 32")
        steps = self.num_scheduler_steps
        if steps is not None and (isinstance(steps, bool)
                                  or not isinstance(steps, numbers.Integral)
                                  or not 1 <= steps <= self.block_size):
            raise ValueError(
                f"num_scheduler_steps={steps!r} must be None (auto) or an int from 1 (off) "
                f"to block_size ({self.block_size}): a multi-step decode takes at most one new "
                "KV block per sequence")
        if self.multi_step_max_num_seqs is not None and self.multi_step_max_num_seqs < 1:
            raise ValueError(f"multi_step_max_num_seqs={self.multi_step_max_num_seqs} must be "
                             ">= 1 (or None: any batch)")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks} must be >= 1 (or None)")
        if self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes < 1:
            raise ValueError(f"kv_cache_memory_bytes={self.kv_cache_memory_bytes} must be > 0")
        if (isinstance(self.gpu_memory_utilization, bool)
                or not isinstance(self.gpu_memory_utilization, numbers.Real)):
            raise ValueError(  # noqa: TRY004 - API contract: bad settings are a ValueError
                f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be a number")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]"
            )
        if self.max_num_seqs is None or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens is None or self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len={self.max_model_len} must be >= 1 (or None)")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode={self.preemption_mode!r}; use 'recompute' or 'swap'"
            )
        if self.swap_space_bytes is None or self.swap_space_bytes < 0:
            raise ValueError(f"swap_space_bytes={self.swap_space_bytes} must be >= 0")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend={self.attention_backend!r}; use 'auto', 'torch' or 'triton'"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported; use 'auto' (the "
                "model's dtype) or 'fp8' (float8 e4m3 with a scale per token and KV head)"
            )
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size!r} must be an int >= 1")
        if self.distributed_executor_backend not in EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend={self.distributed_executor_backend!r}; use "
                "'auto', 'uni' or 'mp'")
        if self.distributed_executor_backend == "uni" and self.tensor_parallel_size > 1:
            raise ValueError(
                f"distributed_executor_backend='uni' runs one rank in the engine's process, but "
                f"tensor_parallel_size={self.tensor_parallel_size}; use 'mp' or 'auto'")
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)  # raises ValueError if bad

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """`speculative_config` parsed and validated, or None (no speculative decoding)."""
        if self.speculative_config is None:
            return None
        return SpeculativeConfig.from_dict(self.speculative_config)


def resolve_multi_step(config: EngineConfig, device_type: str) -> EngineConfig:
    """`config` with num_scheduler_steps decided: unchanged where it is an int; for None
    (auto), on CUDA with CUDA graphs (not enforce_eager) AUTO_SCHEDULER_STEPS passes while at
    most AUTO_MULTI_STEP_MAX_NUM_SEQS sequences decode (a multi_step_max_num_seqs given is
    kept), elsewhere 1. Measured on the H200 (docs/design.md, "Multi-step decode"): bursts of 8
    beat one pass at batch 1 (0.582-0.586 against 0.601-0.814 ms a token at context 512) and
    at 8 and 32 rows (1-9%), and lost at 256 rows (nano-vllm's workload 60,749 and 64,471
    against 65,470 tok/s), where the host is already hidden under the device. On the CPU the
    model runs on the host, so there is no host work to hide."""
    if config.num_scheduler_steps is not None:
        return config
    if device_type != "cuda" or config.enforce_eager:
        return replace(config, num_scheduler_steps=1)
    cap = config.multi_step_max_num_seqs
    return replace(config, num_scheduler_steps=min(AUTO_SCHEDULER_STEPS, config.block_size),
                   multi_step_max_num_seqs=AUTO_MULTI_STEP_MAX_NUM_SEQS if cap is None else cap)


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
