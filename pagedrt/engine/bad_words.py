"""bad_words (vLLM's `SamplingParams.bad_words`): words that may not be generated
(docs/design.md, "Bad words").

Each word becomes token-id sequences once per request, in the process that tokenizes the
prompt (`resolve_bad_words`, into `SamplingParams.bad_words_token_ids`); a sequence bans its
last token at a step where the request's generated tokens end with the rest of it. Two kinds,
two mechanisms:

    [t]            (one token)    banned at every step: an entry of -inf in the request's
                                  additive row (pagedrt/engine/logit_bias.py), with its
                                  logit_bias and allowed_token_ids, built once per batch row
    [p_1 .. p_m t] (m >= 1)       banned where the generated tokens end with p_1 .. p_m: matched
                                  each step on the host (`BadWordSequences.bans`, numpy, only
                                  for the rows that have such sequences), and the matched
                                  (row, t) set to -inf by one index_put on the device

Only generated tokens are matched, never the prompt's (vLLM v1 matches the output token ids
too): a prompt that ends with p_1 .. p_m does not ban t at the first step.

With async scheduling a row's last generated token may still be being sampled by the step in
flight (`PLACEHOLDER_TOKEN_ID` on the host). A sequence whose p_1 .. p_(m-1) match the tokens
before it is then a candidate: its ban is conditional on the pending token being p_m, which
is compared on the device, with the previous step's sampled ids (`OutputHistory`), so the
overlap of host and device is kept.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import torch

from pagedrt.core.request import PLACEHOLDER_TOKEN_ID
from pagedrt.sampling_params import SamplingParams, short_repr

_ANY = -2  # a prefix position before a shorter sequence's first token: matches every token
_NO_TOKEN = -3  # a tail position before the first generated token: matches no prefix token


def tokenize_bad_words(bad_words: list[str], tokenizer) -> list[list[int]]:
    """The token-id sequences of `bad_words`, as vLLM makes them: each word with its leading
    whitespace removed, encoded without special tokens; then " " + that word, kept where its
    first token differs from the plain form's and it has as many tokens (a word at the start
    of a text and inside one are often different tokens). Duplicates are dropped.

    Args:
        bad_words: non-empty strings (`SamplingParams.bad_words`).
        tokenizer: a Hugging Face tokenizer (anything with `encode(text,
            add_special_tokens=False)` returning a list of ints).

    Returns:
        Non-empty lists of token ids, in the words' order.

    Raises:
        ValueError: a word that gives no token (one of whitespace only), naming it.
    """
    sequences: dict[tuple[int, ...], None] = {}
    for i, word in enumerate(bad_words):
        stripped = word.lstrip()
        plain = list(tokenizer.encode(stripped, add_special_tokens=False)) if stripped else []
        if not plain:
            raise ValueError(f"bad_words[{i}]={short_repr(word)} gives no token with the "
                             "model's tokenizer; give words with at least one character "
                             "that is not whitespace")
        sequences[tuple(plain)] = None
        spaced = list(tokenizer.encode(" " + stripped, add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences[tuple(spaced)] = None
    return [list(seq) for seq in sequences]


def resolve_bad_words(params: SamplingParams, tokenizer) -> SamplingParams:
    """`params` itself where it has no bad_words or they were already turned into token ids
    (`bad_words_token_ids` set); otherwise a copy with `bad_words_token_ids` from
    `tokenize_bad_words`. Called once per request where the prompt is tokenized
    (`LLMEngine.add_request`, `LLM.generate` once per params object, the server's API
    process); `validate_prompt` refuses params with bad_words left unresolved.

    Raises:
        ValueError: bad_words with no tokenizer (`tokenizer` None), or a word that gives no
            token; the message names the value and the fix.
    """
    if params.bad_words is None or params.bad_words_token_ids is not None:
        return params
    if tokenizer is None:
        raise ValueError(f"bad_words={short_repr(params.bad_words)} needs the model's "
                         "tokenizer, and this model has none; give the token ids to ban as "
                         "bad_words_token_ids instead")
    resolved = copy.copy(params)
    resolved.bad_words_token_ids = tokenize_bad_words(params.bad_words, tokenizer)
    return resolved


def single_token_bans(params: SamplingParams) -> list[int]:
    """The tokens banned at every step: those of the one-token sequences."""
    return [seq[0] for seq in params.bad_words_token_ids or () if len(seq) == 1]


def token_sequences(params: SamplingParams) -> list[list[int]]:
    """The sequences of two tokens or more, whose last token is banned after the rest."""
    return [seq for seq in params.bad_words_token_ids or () if len(seq) > 1]


def banned_after(sequences: list[list[int]], output_token_ids) -> list[int]:
    """The last tokens of the `sequences` (each of two tokens or more) whose other tokens end
    `output_token_ids` (the tokens generated so far, all known): what a step bans besides the
    single tokens. The reference path (`logits_processors.processed_logits`)."""
    output = list(output_token_ids)
    n = len(output)
    banned = []
    for seq in sequences:
        m = len(seq) - 1
        if m <= n and output[n - m:] == seq[:-1]:
            banned.append(seq[-1])
    return banned


class OutputHistory(NamedTuple):
    """Where `Sampler.sample_rows` reads the generated tokens of rows with token sequences to
    ban (`BadWordSequences`); the model runner passes it only while some row has them.

    Attributes:
        token_ids: [rows, max_model_len] int32, the InputBatch's `token_ids` (prompt, then
            generated tokens; `PLACEHOLDER_TOKEN_ID` for a token still being sampled).
        pending: [rows] int64, the InputBatch's `pending`: where a row's token still being
            sampled is in `pending_tokens`, or -1.
        pending_tokens: the sampled ids of the step in flight, on the device (async
            scheduling), or None when no step is in flight.
    """

    token_ids: np.ndarray
    pending: np.ndarray
    pending_tokens: torch.Tensor | None


class SequenceBans(NamedTuple):
    """One step's bans from token sequences, each (index, token) banned where `need` is -1,
    or where the row's pending token (`OutputHistory.pending_tokens[src]`) equals `need`.

    Attributes:
        index: [m] int64, indices into the step's rows.
        token: [m] int64, the token banned.
        need: [m] int64, -1 (the ban holds) or the token the pending one must be.
        src: [m] int64, where the pending token is in `pending_tokens` (0 where need is -1).
    """

    index: np.ndarray
    token: np.ndarray
    need: np.ndarray
    src: np.ndarray


_NO_BANS = SequenceBans(*(np.zeros(0, dtype=np.int64) for _ in range(4)))


class BadWordSequences:
    """The token sequences (two tokens or more) of the device side's batch rows, for the
    batched sampler (module docstring).

    Per batch row with such sequences: their prefixes right-aligned in a [S, K] table (K: the
    longest prefix of any row; `_ANY` before a shorter one) and their last tokens. The table
    of all rows is built again only after a row is taken or freed. `num_rows` counts the rows
    with sequences: while it is 0 the sampler does nothing for them.
    """

    def __init__(self) -> None:
        self._sequences: dict[int, list[list[int]]] = {}
        # every row's sequences: owner row [T], prefixes [T, K], last tokens [T]
        self._table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def num_rows(self) -> int:
        return len(self._sequences)

    def set_row(self, row: int, params: SamplingParams) -> None:
        """A batch row taken by a request: its sequences, where it has any."""
        sequences = token_sequences(params)
        if sequences:
            self._sequences[row] = sequences
            self._table = None

    def clear_row(self, row: int) -> None:
        """A batch row freed."""
        if self._sequences.pop(row, None) is not None:
            self._table = None

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        entries = [(row, seq) for row, seqs in self._sequences.items() for seq in seqs]
        width = max(len(seq) - 1 for _, seq in entries)
        owner = np.array([row for row, _ in entries], dtype=np.int64)
        prefixes = np.full((len(entries), width), _ANY, dtype=np.int64)
        last = np.empty(len(entries), dtype=np.int64)
        for i, (_, seq) in enumerate(entries):
            prefixes[i, width - len(seq) + 1:] = seq[:-1]
            last[i] = seq[-1]
        return owner, prefixes, last

    def bans(self, rows: np.ndarray, num_tokens: np.ndarray, prompt_len: np.ndarray,
             history: OutputHistory) -> SequenceBans:
        """The bans of a step that samples `rows` ([B] int64 batch rows), from each row's
        last generated tokens: numpy over the sequences of the rows that have them.

        Args:
            rows: the step's rows, in logits order.
            num_tokens, prompt_len: per batch row, its tokens and its prompt's.
            history: the rows' tokens and where a pending one is.
        """
        if self._table is None:
            self._table = self._build()
        owner, prefixes, last = self._table
        where = np.full(len(num_tokens), -1, dtype=np.int64)
        where[rows] = np.arange(len(rows))
        index = where[owner]
        keep = np.flatnonzero(index >= 0)
        if not len(keep):
            return _NO_BANS
        owner, prefixes, last, index = owner[keep], prefixes[keep], last[keep], index[keep]
        width = prefixes.shape[1]
        # each sequence's row's last `width` tokens, right-aligned; _NO_TOKEN before its first
        # generated one
        columns = num_tokens[owner][:, None] - width + np.arange(width)
        tail = history.token_ids[owner[:, None], np.maximum(columns, 0)].astype(np.int64)
        tail[columns < prompt_len[owner][:, None]] = _NO_TOKEN
        known = ((prefixes == tail) | (prefixes == _ANY))[:, :-1].all(axis=1)
        now = known & (tail[:, -1] == prefixes[:, -1])
        pending = known & (tail[:, -1] == PLACEHOLDER_TOKEN_ID)
        hit = np.flatnonzero(now | pending)
        if not len(hit):
            return _NO_BANS
        conditional = pending[hit]
        src = np.where(conditional, history.pending[owner[hit]], 0)
        assert (src >= 0).all(), "a placeholder token with nothing pending"
        return SequenceBans(index[hit], last[hit],
                            np.where(conditional, prefixes[hit, -1], -1), src)


def apply_sequence_bans(logits: torch.Tensor, index: torch.Tensor, token: torch.Tensor,
                        need: torch.Tensor | None, src: torch.Tensor | None,
                        pending_tokens: torch.Tensor | None) -> None:
    """Set the banned (index, token) entries of `logits` ([B, vocab] float32, in place) to
    -inf: all of them where `need` is None (no ban waits on a pending token), else those
    whose `need` is -1 or equals `pending_tokens[src]` (an add of -inf or 0, accumulated:
    the same entry may be named twice)."""
    if need is None:
        logits[index, token] = float("-inf")
        return
    assert pending_tokens is not None, "bans wait on pending tokens, but none was given"
    hit = (need < 0) | (pending_tokens.index_select(0, src) == need)
    add = torch.where(hit, float("-inf"), 0.0).to(logits.dtype)
    logits.index_put_((index, token), add, accumulate=True)
