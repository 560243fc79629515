"""Request checks that need only the engine's limits, so that a process without the model (the
server's API process, see docs/design.md) can reject bad requests before they reach the engine.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

from pagedrt.core.beam import num_beam_candidates
from pagedrt.engine.bad_words import single_token_bans
from pagedrt.sampling_params import SamplingParams, short_repr


class EngineLimits(NamedTuple):
    """What a request is checked against (plain data: it travels between processes).

    Attributes:
        vocab_size: token ids must be in [0, vocab_size).
        max_model_len: longest sequence, prompt + output, in tokens.
        num_blocks: KV blocks in the whole cache.
        block_size: tokens per KV block.
        max_num_seqs: most sequences in one step (bounds n).
        max_blocks_per_seq: most blocks one sequence holds at once when that is less than its
            whole length needs (a model whose every layer has a sliding window: the window
            plus one step's tokens); None = every block of its length.
        num_eos_tokens: the model's EOS ids (a beam search keeps more candidates per EOS id).
        enable_prefix_caching: the engine's setting (a preempted beam search shares its
            blocks again only through the prefix cache).
        max_position_embeddings: the model's longest context, the most max_model_len can be
            raised to (None: unknown; the error for a long prompt then names no bound).
        eos_token_ids: the model's EOS ids (what min_tokens blocks besides stop_token_ids).
    """

    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_blocks_per_seq: int | None = None
    num_eos_tokens: int = 1
    enable_prefix_caching: bool = True
    max_position_embeddings: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the whole KV cache holds."""
        return self.num_blocks * self.block_size


def check_priority(priority) -> int:
    """A request's priority (lower runs first; any int, as in vLLM) as an int.

    Raises:
        ValueError: not an int (a bool, a float, a string, None...).
    """
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
            f"priority={short_repr(priority)} must be an int (lower runs first; 0 is the "
            "default)")
    return int(priority)


def max_tokens_that_fit(num_prompt_tokens: int, limits: EngineLimits) -> int:
    """The most tokens a prompt of `num_prompt_tokens` can be given: up to max_model_len, or
    the whole KV cache where it holds fewer tokens (at least 1: a prompt too long is then
    refused by `validate_prompt`, naming its length)."""
    return max(1, min(limits.max_model_len, limits.kv_capacity_tokens) - num_prompt_tokens)


def resolve_max_tokens(token_ids: list[int], params: SamplingParams,
                       limits: EngineLimits) -> SamplingParams:
    """`params` itself, or, where its max_tokens is None (vLLM's "as many as fit"), a copy
    with `max_tokens_that_fit` for this prompt (docs/design.md, "Request lifecycle")."""
    if params.max_tokens is not None:
        return params
    return dataclasses.replace(params, max_tokens=max_tokens_that_fit(len(token_ids), limits))


def truncate_prompt(token_ids: list[int], truncate_prompt_tokens: int | None,
                    max_tokens: int | None, limits: EngineLimits) -> list[int]:
    """`token_ids` as `SamplingParams.truncate_prompt_tokens` (already checked) leaves them,
    vLLM's left truncation: their last k tokens for k >= 1; for -1, their last
    min(max_model_len, KV cache tokens) - max_tokens (max_tokens=None counted as 1; at least
    1 token), so that the prompt fits with its max_tokens; unchanged for None or a prompt no
    longer than that. Call before `resolve_max_tokens` and `validate_prompt` (LLM.generate,
    LLMEngine.add_request and the server do).

    Raises:
        ValueError: k above max_model_len (as vLLM refuses it), naming both.
    """
    k = truncate_prompt_tokens
    if k is None:
        return token_ids
    if k > limits.max_model_len:
        raise ValueError(f"truncate_prompt_tokens={k} is more than max_model_len="
                         f"{limits.max_model_len}: give at most {limits.max_model_len}, or -1 "
                         "to keep the most tokens that leave room for max_tokens")
    if k == -1:
        room = min(limits.max_model_len, limits.kv_capacity_tokens)
        k = max(1, room - (1 if max_tokens is None else max_tokens))
    return token_ids[-k:] if len(token_ids) > k else token_ids


def validate_prompt(token_ids: list[int], params: SamplingParams, limits: EngineLimits, *,
                    echo_only: bool = False) -> None:
    """Check a tokenized prompt with its sampling params against the engine's limits.

    The params are checked again as at construction (`SamplingParams.__post_init__`, which
    also turns an output_kind given by name into the enum), so that a field assigned after
    construction is checked too.

    `echo_only`: the request is the server's echo-only scoring (completions with echo=true and
    max_tokens=0), run as max_tokens=1; the same bound (prompt + max_tokens within
    max_model_len) then words a prompt too long for the max_tokens=0 the client sent: at most
    max_model_len - 1 tokens.

    Raises:
        ValueError: empty prompt, a token id that is not an int in [0, vocab_size), a prompt
            or prompt + max_tokens longer than max_model_len, or more KV blocks than the whole
            cache holds, or a sampling param out of its range (a logit_bias key, an
            allowed_token_ids entry or a bad word's token outside [0, vocab_size) too), or
            bad_words not yet turned into token ids (`bad_words.resolve_bad_words`); the
            message names the value and the fix.
    """
    params.__post_init__()
    if params.bad_words is not None and params.bad_words_token_ids is None:
        raise ValueError(f"bad_words={short_repr(params.bad_words)} are not tokenized yet: "
                         "pass the params through pagedrt.engine.bad_words.resolve_bad_words "
                         "with the model's tokenizer first (LLM.generate and "
                         "LLMEngine.add_request do)")
    if params.adjusts_logits:
        _validate_token_controls(params, limits)
    if params.max_tokens is None:
        raise ValueError("max_tokens=None is set per prompt: pass the params through "
                         "resolve_max_tokens first (LLM.generate and LLMEngine.add_request do)")
    n = len(token_ids)
    if n == 0:
        raise ValueError("prompt is empty; give at least one token")
    # the length first: it costs nothing, the id check below reads every id
    max_model_len = limits.max_model_len
    if echo_only and n + params.max_tokens > max_model_len:
        room = max_model_len - params.max_tokens
        raise ValueError(f"prompt has {n} tokens; with echo=true and max_tokens=0 it may have "
                         f"at most max_model_len - {params.max_tokens} = {room} (the prompt is "
                         "scored by one engine step, which makes a token)")
    if n > max_model_len:
        raise ValueError(f"prompt has {n} tokens, more than max_model_len={max_model_len}; "
                         f"{_longer_context_fix(max_model_len, limits)}")
    if n == max_model_len:  # (whatever max_tokens, or its default, asked for)
        raise ValueError(f"prompt has {n} tokens, all of max_model_len={max_model_len}, which "
                         f"leaves no room for a generated token; "
                         f"{_longer_context_fix(max_model_len, limits)}")
    vocab = limits.vocab_size
    # fast path in C (set of types, min, max): a Python loop here cost about 20 ms of host
    # time for 256 prompts of 512 tokens, before the first step could start
    if not (set(map(type, token_ids)) <= {int} and 0 <= min(token_ids) and max(token_ids) < vocab):
        bad = next((t for t in token_ids
                    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab),
                   None)
        if bad is not None:  # (an int subclass other than bool passes, as it always did)
            raise ValueError(f"prompt token id {bad!r} is not an int in [0, {vocab})")
    if n + params.max_tokens > max_model_len:
        raise ValueError(
            f"{_asked(n, params)} = {n + params.max_tokens} exceeds max_model_len={max_model_len}; "
            "lower max_tokens or shorten the prompt"
        )
    need = -(-(n + params.max_tokens) // limits.block_size)
    if limits.max_blocks_per_seq is not None:
        need = min(need, limits.max_blocks_per_seq)
    if need > limits.num_blocks:
        raise ValueError(
            f"{_asked(n, params)} needs {need} KV blocks but the whole cache has "
            f"{_blocks(limits)}; lower max_tokens or enlarge the KV cache ({_CACHE_SIZING})"
        )
    if params.beam_search is not None:
        _validate_beam_search(n, params, limits)


def _validate_token_controls(params: SamplingParams, limits: EngineLimits) -> None:
    """logit_bias keys, allowed_token_ids entries and bad words' token ids within the
    vocabulary (their types and the bias range were checked by `SamplingParams`), and
    allowed_token_ids not all of them ids that single-token bad words ban, or that min_tokens
    blocks (stop_token_ids, and EOS unless ignore_eos): every logit would be -inf, and no
    allowed token could be sampled."""
    vocab_size = limits.vocab_size
    sequences = params.bad_words_token_ids or ()
    for seq in sequences:
        if max(seq) >= vocab_size:
            bad = next(t for t in seq if t >= vocab_size)
            name = ("bad_words" if params.bad_words is not None else "bad_words_token_ids")
            raise ValueError(f"{name}={short_repr(params.bad_words or sequences)}: token id "
                             f"{bad} (of the sequence {short_repr(seq)}) is not in the "
                             f"vocabulary [0, {vocab_size}); leave it out")
    if params.logit_bias is not None:
        bad = next((t for t in params.logit_bias if t >= vocab_size), None)
        if bad is not None:
            raise ValueError(f"logit_bias[{bad}]: token id {bad} is not in the vocabulary "
                             f"[0, {vocab_size})")
    allowed = params.allowed_token_ids
    if allowed is not None and max(allowed) >= vocab_size:
        i = next(i for i, t in enumerate(allowed) if t >= vocab_size)
        raise ValueError(f"allowed_token_ids[{i}]={allowed[i]} is not a token id of the "
                         f"vocabulary [0, {vocab_size})")
    banned = set(single_token_bans(params))
    if allowed is not None and set(allowed) <= banned:
        raise ValueError(
            f"allowed_token_ids={short_repr(allowed)} holds only token ids that bad_words "
            "bans: nothing could be sampled; allow another token or ban fewer words")
    if allowed is not None and params.min_tokens:
        blocked = set(params.stop_token_ids) | banned
        if not params.ignore_eos:
            blocked.update(limits.eos_token_ids)
        if set(allowed) <= blocked:
            also = " (and ids that bad_words bans)" if banned & set(allowed) else ""
            raise ValueError(
                f"allowed_token_ids={short_repr(allowed)} holds only stop or EOS token ids, "
                f"which min_tokens={params.min_tokens} blocks until that many tokens are out"
                f"{also}: nothing could be sampled; allow another token or lower min_tokens")


def _longer_context_fix(max_model_len: int, limits: EngineLimits) -> str:
    """What to do about a prompt longer than max_model_len (made only for an error): raise it
    where the model allows more, else only shorten the prompt."""
    most = limits.max_position_embeddings
    if most is not None and max_model_len >= most:
        return (f"shorten it (max_model_len is already the model's max_position_embeddings="
                f"{most})")
    bound = "" if most is None else f", up to the model's max_position_embeddings={most}"
    return f"shorten it or raise max_model_len (`--max-model-len` on the command line{bound})"


# the EngineConfig fields that size the KV cache, named where a request needs more blocks than it
# has (on the command line: --num-kv-blocks, --kv-cache-memory-bytes, --gpu-memory-utilization)
_CACHE_SIZING = ("num_kv_blocks, or kv_cache_memory_bytes on a CPU, gpu_memory_utilization on "
                 "CUDA")


def _blocks(limits: EngineLimits) -> str:
    """'1 block of 16 tokens' / '8 blocks of 16 tokens': the whole cache, in an error."""
    n = limits.num_blocks
    return f"{n} block{'' if n == 1 else 's'} of {limits.block_size} tokens"


def _asked(n: int, params: SamplingParams) -> str:
    """How validate_prompt's length errors name the request (made only for an error)."""
    return f"prompt ({n} token{'' if n == 1 else 's'}) + max_tokens ({params.max_tokens})"


def _validate_beam_search(num_prompt: int, params: SamplingParams, limits: EngineLimits) -> None:
    """A beam search's width against the step and vocabulary limits, and its blocks (all W
    slots at their longest, sharing the prompt's full blocks) against the whole cache."""
    beam = params.beam_search
    width = beam.beam_width
    if width > limits.max_num_seqs:
        raise ValueError(f"beam_width={width} exceeds max_num_seqs={limits.max_num_seqs}; "
                         "lower beam_width or raise max_num_seqs")
    k = num_beam_candidates(width, 0 if beam.ignore_eos else limits.num_eos_tokens)
    if k > limits.vocab_size:
        raise ValueError(f"beam_width={width} keeps {k} candidates per step, more than the "
                         f"vocabulary's {limits.vocab_size} tokens; lower beam_width")
    bs = limits.block_size
    total = -(-(num_prompt + params.max_tokens) // bs)
    shared = num_prompt // bs if limits.enable_prefix_caching else 0
    need = shared + width * (total - shared)
    if limits.max_blocks_per_seq is not None:  # a sliding window bounds every slot's table
        need = min(need, width * limits.max_blocks_per_seq)
    if need > limits.num_blocks:
        raise ValueError(
            f"beam_width={width} over a prompt of {num_prompt} tokens with max_tokens="
            f"{params.max_tokens} needs up to {need} KV blocks but the whole cache has "
            f"{_blocks(limits)}; lower beam_width or max_tokens or enlarge the KV cache "
            f"({_CACHE_SIZING})")
