"""A tiny random-weight Llama for fast engine tests (prefix caching, scheduling, preemption).

Weights are drawn from a fixed seed with a large enough spread that the logits are far from
flat: greedy argmaxes then have wide top-2 gaps, so fp32 round-off from a different batch
composition or chunking never flips a token, and comparisons can demand exact equality.
"""

from __future__ import annotations

import math

import torch

from pagedrt.config import ModelConfig
from pagedrt.models.loader import LoadedModel, build_model

TINY_CONFIG = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=384, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=False,
)


def build_tiny_llama(seed: int = 0, config: ModelConfig = TINY_CONFIG) -> LoadedModel:
    """The tiny model, fp32 on CPU, every parameter initialised from `seed` (build_model
    leaves them uninitialised). No tokenizer: prompts are token-id lists."""
    model = build_model(config, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            elif "embed_tokens" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
            elif "lm_head" in name:
                # logits with a spread of about 4 per step: top-2 gaps far above fp32 noise
                param.copy_(torch.randn(param.shape, generator=gen) * 4.0
                            / math.sqrt(param.shape[1]))
            else:
                # 2 / sqrt(fan_in): attention scores sharp enough that the context matters
                param.copy_(torch.randn(param.shape, generator=gen) * 2.0
                            / math.sqrt(param.shape[1]))
    return LoadedModel(model.eval(), config, None, "tiny")


def perturb_norms(loaded: LoadedModel, generator: torch.Generator) -> LoadedModel:
    """Set every norm weight of `loaded` to 1 + 0.3 * N(0, 1) (drawn from `generator`), so that
    a path that skips or misplaces a norm weight shows in the tokens; returns `loaded`."""
    with torch.no_grad():
        for name, p in loaded.model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=generator))
    return loaded


def tiny_word(i: int) -> str:
    """The word of `tiny_word_tokenizer`'s token i (i < 192): two or more lowercase letters
    ("ba", "bb", ..., "ij"), so that ByteLevel's pre-tokenizer keeps it whole."""
    letters = ""
    i += 26
    while i:
        letters = chr(97 + i % 26) + letters
        i //= 26
    return letters


def tiny_word_tokenizer():
    """A word-level Hugging Face fast tokenizer over the tiny model's 384 ids: token i < 192 is
    `tiny_word(i)` and token 192 + i is the same word after a space (GPT-2's "\u0120"), so a
    word at the start of a text and inside one are different tokens, as in real byte-level
    BPE vocabularies. Unknown words encode to token 0. No special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    half = TINY_CONFIG.vocab_size // 2
    vocab = {}
    for i in range(half):
        vocab[tiny_word(i)] = i
        vocab["\u0120" + tiny_word(i)] = half + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token=tiny_word(0)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def byte_level_chat_tokenizer(chat_template: str):
    """A byte-level BPE tokenizer with no merges (every text round-trips; 259 ids, within the
    tiny model's vocabulary), ChatML's special tokens and `chat_template`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = chat_template
    return tok


def with_tokenizer(loaded: LoadedModel) -> LoadedModel:
    """`loaded` with `tiny_word_tokenizer` (text prompts, bad_words, detokenized outputs)."""
    return loaded._replace(tokenizer=tiny_word_tokenizer())
