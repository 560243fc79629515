"""Model shapes from published config.json files, for benchmarks with random weights.

No weights are downloaded: `random_model` builds the network from the shape and fills it with
N(0, 0.02) (the usual initializer_range, `pagedrt.models.weights.RandomWeights`), which gives the
same FLOPs and bytes as the real model.
"""

from __future__ import annotations

import torch

from pagedrt.config import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    # Qwen/Qwen2-0.5B config.json
    "qwen2-0.5b": ModelConfig(
        architecture="Qwen2ForCausalLM", vocab_size=151936, hidden_size=896,
        intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=32768, tie_word_embeddings=True, attention_bias=True,
        bos_token_id=151643, eos_token_ids=(151643,),
    ),
    # Qwen/Qwen3-0.6B config.json (head_dim 128 is set there, not hidden / heads = 64; q/k norm;
    # no qkv bias; sliding window off)
    "qwen3-0.6b": ModelConfig(
        architecture="Qwen3ForCausalLM", vocab_size=151936, hidden_size=1024,
        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=True, attention_bias=False,
        qk_norm=True, bos_token_id=151643, eos_token_ids=(151645,),
    ),
    # mistralai/Mistral-7B-v0.1 config.json (every layer windowed: 4096 tokens; v0.2 and
    # later dropped the window)
    "mistral-7b": ModelConfig(
        architecture="MistralForCausalLM", vocab_size=32000, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=False,
        bos_token_id=1, eos_token_ids=(2,), sliding_window=4096,
        layer_types=("sliding_attention",) * 32,
    ),
    # google/gemma-3-1b-it config.json (sliding_window_pattern 6: layers 5, 11, 17, 23 global;
    # local window 512, local RoPE base 10k, global 1M; query_pre_attn_scalar 256)
    "gemma3-1b": ModelConfig(
        architecture="Gemma3ForCausalLM", vocab_size=262144, hidden_size=1152,
        intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=32768, tie_word_embeddings=True, attention_bias=False,
        qk_norm=True, bos_token_id=2, eos_token_ids=(1, 106), sliding_window=512,
        layer_types=tuple("sliding_attention" if (i + 1) % 6 else "full_attention"
                          for i in range(26)),
        rope_local_theta=10000.0, query_pre_attn_scalar=256,
    ),
    # meta-llama/Meta-Llama-3-8B config.json
    "llama3-8b": ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=8192, tie_word_embeddings=False, attention_bias=False,
        bos_token_id=128000, eos_token_ids=(128001,),
    ),
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json
    "smollm2-135m": ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576,
        intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
        max_position_embeddings=8192, tie_word_embeddings=True, attention_bias=False,
        bos_token_id=1, eos_token_ids=(2,),
    ),
}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]


def random_model(config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A LoadedModel with `RandomWeights(config, seed)` (N(0, 0.02), norms the identity), no
    tokenizer: the weights a tensor-parallel engine given the same RandomWeights draws."""
    from pagedrt.models.loader import load_model
    from pagedrt.models.weights import RandomWeights

    return load_model(RandomWeights(config, seed), dtype, device)
