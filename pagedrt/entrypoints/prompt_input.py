"""Prompt text to token ids in the API process, bounded so that one request stalls no one.

    count check   prompts x n <= max_prompts_per_request                    (400)
    length check  characters <= max_model_len x chars_per_token, before     (400,
                  tokenizing: a text longer than that cannot fit             context_length_
                                                                             exceeded)
    tokenize      on a worker thread for texts over INLINE_CHARS characters (HF fast tokenizers
                  run in Rust with the GIL released, so the event loop keeps answering)

`chars_per_token` is the longest token of the vocabulary in characters (81 for SmolLM2: a
newline and 80 spaces). For byte-level BPE (GPT-2 style, SmolLM2, Qwen2, Llama 3) and for
SentencePiece vocabularies, every token stands for at most that many characters of text, so no
prompt that fits is refused. (A normalizer that merges characters, e.g. NFC composition of
a letter and an accent, could in theory pack more; such texts should be sent normalized.)
"""

from __future__ import annotations

import asyncio

from pagedrt.engine.validation import EngineLimits
from pagedrt.entrypoints.protocol import APIError

# Texts (all prompts of a request together) up to this many characters are tokenized on the
# event loop (about 1 ms); longer ones on a worker thread.
INLINE_CHARS = 4096


def longest_token_chars(tokenizer) -> int | None:
    """Characters of the vocabulary's longest token (its raw vocabulary string, where a
    byte-level BPE character stands for one byte); None if the tokenizer has no vocabulary."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError):
        return None
    return max((len(token) for token in vocab), default=None)


class PromptInput:
    """Checks and tokenizes the prompts of one API process.

    Args:
        tokenizer: a Hugging Face tokenizer, or None (token-id prompts only).
        limits: the engine's limits (max_model_len).
        max_prompts_per_request: most sequences (prompts x n) in one request.
    """

    def __init__(self, tokenizer, limits: EngineLimits, max_prompts_per_request: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = limits.max_model_len
        self.max_sequences = max_prompts_per_request
        self.chars_per_token = None if tokenizer is None else longest_token_chars(tokenizer)

    @property
    def max_chars(self) -> int | None:
        """Longest prompt text, in characters, that can still fit in max_model_len tokens."""
        if self.chars_per_token is None:
            return None
        return self.max_model_len * self.chars_per_token

    def check_count(self, num_prompts: int, n: int) -> None:
        """Raises APIError(400) when num_prompts x n exceeds max_prompts_per_request."""
        if num_prompts * n > self.max_sequences:
            raise APIError(400, f"{num_prompts} prompt(s) x n={n} = {num_prompts * n} sequences "
                           f"exceed --max-prompts-per-request={self.max_sequences}; split the "
                           "request", param="n" if num_prompts == 1 else "prompt")

    def check_length(self, num_chars: int, field: str) -> None:
        """Raises APIError(400, context_length_exceeded) for a text too long to fit."""
        max_chars = self.max_chars
        if max_chars is not None and num_chars > max_chars:
            raise APIError(400, f"{field} has {num_chars} characters, more than max_model_len="
                           f"{self.max_model_len} tokens can hold (at most "
                           f"{self.chars_per_token} characters per token for this tokenizer); "
                           "shorten it", param=field, code="context_length_exceeded")

    async def encode(self, texts: list[str], field: str, add_special_tokens: bool | None = None,
                     allow_empty: bool = False) -> list[list[int]]:
        """Token ids of each text; raises APIError(400) for an empty (unless `allow_empty`:
        /tokenize, which answers with no tokens as vLLM does) or too long text, or when the
        model has no tokenizer. `add_special_tokens`: passed to the tokenizer's encode (None:
        its default)."""
        empty = None if allow_empty else next((i for i, text in enumerate(texts) if not text),
                                              None)
        if empty is not None:
            which = field if len(texts) == 1 else f"{field}[{empty}]"
            raise APIError(400, f"{which} is empty; give at least one token", param=field)
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer; send token ids", param=field)
        for text in texts:
            self.check_length(len(text), field)
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        if sum(len(text) for text in texts) <= INLINE_CHARS:
            return [self.tokenizer.encode(text, **kwargs) for text in texts]
        return await asyncio.to_thread(
            lambda: [self.tokenizer.encode(text, **kwargs) for text in texts])
