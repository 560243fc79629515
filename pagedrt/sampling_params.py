"""SamplingParams: per-request decoding settings, with vLLM's names and defaults;
RequestOutputKind, what each streamed output of a request holds; and BeamSearchParams, vLLM's
settings of a beam search (docs/design.md, "Beam search")."""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field

# Temperatures below this are greedy (as vLLM's _SAMPLING_EPS): dividing float32 logits by a
# smaller one can overflow to inf, and inf - inf in the softmax is NaN.
MIN_SAMPLING_TEMPERATURE = 1e-5


class RequestOutputKind(enum.Enum):
    """What the outputs that `LLMEngine.step()` reports for a request hold (vLLM's names).

    CUMULATIVE: every output holds each sample's whole text, token ids and logprobs so far
        (`delta_text` and `delta_token_ids` hold what it adds); copying them makes a streamed
        request of n tokens cost O(n^2) host work over its life.
    DELTA: every output holds only what it adds: `text`, `token_ids` and `logprobs` are the
        new part (`cumulative_logprob` stays the running sum); O(new tokens) per output.
    FINAL_ONLY: the request is reported once, finished, with the whole text and token ids
        (as `LLMEngine.add_request(..., stream=False)`).
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    """How to pick the tokens of one request.

    Attributes:
        n: independent samples of the prompt; they share the prompt's KV blocks (copy-on-write).
        temperature: 0 means greedy; otherwise logits are divided by it. Values below
            `MIN_SAMPLING_TEMPERATURE` (1e-5) are greedy too (see `greedy`).
        top_p: nucleus sampling mass, in (0, 1]; 1 disables it (Holtzman et al. 2019).
        top_k: keep the k most likely tokens; -1 or 0 disables it; k >= vocab size disables it.
        min_p: drop tokens whose probability is below min_p times the top probability; 0 disables.
        presence_penalty, frequency_penalty: OpenAI-style additive penalties on generated tokens.
        repetition_penalty: multiplicative penalty on prompt and generated tokens (Keskar et al.
            2019, CTRL); 1 disables it.
        seed: per-request seed; the request's samples are then reproducible whatever else runs in
            the same batch and however often it is preempted (sample i of n draws as a request
            with seed + i would; docs/design.md, "Seeded sampling").
        max_tokens: most tokens to generate (>= 1), or None for as many as fit (vLLM's
            None): max_model_len, or the whole KV cache where it holds fewer tokens, less the
            prompt's; `LLM.generate` and `LLMEngine.add_request` set it per prompt
            (`validation.resolve_max_tokens`).
        min_tokens: EOS and stop token ids are suppressed until this many tokens were generated,
            and stop strings are matched only from the next token on (one inside the first
            min_tokens tokens neither stops nor cuts the text; as vLLM).
        stop: strings that end generation; the matched string is not part of the output text.
        stop_token_ids: token ids that end generation (besides EOS unless ignore_eos). The
            token that ends it (one of these, or EOS) stays in `token_ids`, but its text is
            left out of `text` unless include_stop_str_in_output, as in vLLM.
        ignore_eos: keep generating past EOS until max_tokens.
        logprobs: return the log-probabilities of this many top tokens per step (None: none).
        prompt_logprobs: return, for every prompt token after the first, its log-probability
            given the tokens before it and this many most likely tokens at its position (0:
            the prompt token alone; None: none; at most 20), in `RequestOutput.prompt_logprobs`.
            Such a request takes no prefix-cache hit: it computes its whole prompt
            (docs/design.md, "Request lifecycle"). Not with beam search.
        skip_special_tokens: drop special tokens from the output text.
        include_stop_str_in_output: keep the matched stop string, or the text of the stop
            token (EOS or one of stop_token_ids) that ended generation, in the text.
        beam_search: run the request as a beam search of these settings instead of sampling
            (`BeamSearchParams.to_sampling_params` fills in the rest); None: sampling.
        output_kind: a `RequestOutputKind`, or its name as a string in any case ("cumulative",
            "delta", "final_only"; stored as the enum): whether `LLMEngine.step()` reports the
            whole output so far (CUMULATIVE, the default), only what each output adds (DELTA),
            or the request once finished (FINAL_ONLY). `LLM.generate` returns whole outputs
            whatever it is; a beam search is reported once, whole.
        logit_bias: OpenAI's map of token id (an int >= 0, within the model's vocabulary) to a
            bias in [-100, 100], added to that token's logit before penalties, temperature and
            the filters (docs/design.md, "Logit bias and allowed tokens"); -100 all but bans a
            token, +100 all but forces it. None (or an empty map, stored as None): no bias.
        allowed_token_ids: vLLM's list of the only token ids that may be sampled (ints >= 0
            within the vocabulary; non-empty); every other token's logit is -inf. None: every
            token. Neither setting changes the logprobs returned, which stay those of the raw
            model distribution; neither goes with beam search.
        bad_words: vLLM's list of words (non-empty strings) that may not be generated. More
            precisely, each word becomes token-id sequences (`bad_words_token_ids`), and the
            last token of a sequence is banned (its logit set to -inf) at every step where the
            tokens generated so far end with the rest of it (a one-token sequence: at every
            step). Only generated tokens count, not the prompt's (vLLM v1's rule). None (or an
            empty list, stored as None): no ban. Not with beam search; the logprobs returned
            stay those of the raw model distribution (as with logit_bias). docs/design.md,
            "Bad words".
        bad_words_token_ids: the token-id sequences `bad_words` becomes with the model's
            tokenizer, set by the engine when it takes the request
            (`pagedrt.engine.bad_words.resolve_bad_words`: each word with leading spaces
            removed, tokenized without special tokens, and with one leading space where that
            starts with another token and gives as many, vLLM's rule). It may also be given
            directly: token sequences to ban, for a model without a tokenizer (given with
            bad_words, it is taken as their tokenization: the words are not tokenized again).
            A list of non-empty lists of token ids (ints >= 0, within the vocabulary); None (or
            empty, stored as None): none. Not with beam search.
        truncate_prompt_tokens: vLLM's left truncation of the tokenized prompt: an int k >= 1
            keeps only its last k tokens (a prompt of k tokens or fewer is unchanged); -1 keeps
            the most that leave room for max_tokens (`validation.truncate_prompt`: the last
            min(max_model_len, KV cache tokens) - max_tokens, with max_tokens=None counted as
            1); None: no truncation. Applied after tokenization (after the chat template in
            `LLM.chat` and on the server's chat endpoint), before the prompt is checked, so
            the truncated prompt is what runs, what prompt_logprobs score and what
            `RequestOutput.prompt_token_ids` holds.

    Raises:
        ValueError: from `__post_init__`, naming the field, the value and the allowed range;
            every float must be finite (NaN and +-inf are refused).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    beam_search: BeamSearchParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        self.output_kind = _as_output_kind(self.output_kind)
        if isinstance(self.stop, str):
            if not self.stop:
                raise ValueError("stop='' must be a non-empty string (or a list of non-empty "
                                 "strings; None or [] for no stop strings)")
            self.stop = [self.stop]
        self.stop = _as_list("stop", self.stop, "a string or a list of non-empty strings")
        self.stop_token_ids = _as_list("stop_token_ids", self.stop_token_ids,
                                       "a list of non-negative ints")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            _check_bool(name, getattr(self, name))
        _check_int("n", self.n, 1)
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(
                f"temperature={short_repr(self.temperature)} must be >= 0 (0 means greedy)")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={short_repr(self.top_p)} must be in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(  # noqa: TRY004 - API contract: bad params are a ValueError
                f"top_k={short_repr(self.top_k)} must be an int (-1 or 0 disables it)")
        if not -1 <= self.top_k < 2**63:  # the sampler keeps it in an int64 array
            raise ValueError(
                f"top_k={short_repr(self.top_k)} must be -1 (disabled), 0 (disabled) or in "
                "[1, 2**63) (a 64-bit int; a top_k of the vocabulary's size or more keeps "
                "every token)")
        _check_number("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p={short_repr(self.min_p)} must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name}={short_repr(value)} must be in [-2, 2]")
        _check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty={short_repr(self.repetition_penalty)} must be > 0")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise ValueError(f"seed={short_repr(self.seed)} must be an int or None")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed={short_repr(self.seed)} must be in [-2**63, 2**63) (a 64-bit int)")
        if self.max_tokens is not None:  # (None: as many as fit, set per prompt)
            _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}")
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop={short_repr(self.stop)} must be a list of non-empty "
                                 f"strings: stop[{i}] is {short_repr(s)}")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**63
               for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids={short_repr(self.stop_token_ids)} must be ints in [0, 2**63) "
                "(token ids)")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0)
            if self.logprobs > 20:
                raise ValueError(f"logprobs={self.logprobs} must be at most 20")
        prompt_k = self.prompt_logprobs
        if prompt_k is not None and (isinstance(prompt_k, bool) or not isinstance(prompt_k, int)
                                     or not 0 <= prompt_k <= 20):
            raise ValueError(f"prompt_logprobs={short_repr(prompt_k)} must be None or an int in "
                             "[0, 20]")
        check_truncate_prompt_tokens(self.truncate_prompt_tokens)
        self._check_token_controls()
        self._check_bad_words()
        if self.beam_search is not None:
            self._check_beam_search()

    def _check_token_controls(self) -> None:
        """logit_bias and allowed_token_ids: their types, ranges and non-emptiness (the
        vocabulary bound is checked against the model, in `validation.validate_prompt`);
        stored as a dict of int -> float and a list of ints."""
        bias = self.logit_bias
        if bias is not None:
            if not isinstance(bias, dict):
                raise ValueError(f"logit_bias={short_repr(bias)} must be a map of token ids to "
                                 "biases in [-100, 100]")
            for key, value in bias.items():
                if not _is_token_id(key):
                    raise ValueError(f"logit_bias[{short_repr(key)}]: the key must be a token "
                                     "id (an int >= 0, below the vocabulary's size)")
                if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                        or not -100.0 <= value <= 100.0):  # (NaN fails the comparison)
                    raise ValueError(f"logit_bias[{key}]={short_repr(value)} must be a number "
                                     "in [-100, 100]")
            # (numpy ints and floats taken as Python's)
            self.logit_bias = {int(key): float(value) for key, value in bias.items()} or None
        if self.allowed_token_ids is not None:
            allowed = _as_list("allowed_token_ids", self.allowed_token_ids,
                               "a non-empty list of token ids (ints >= 0)")
            if not allowed:
                raise ValueError("allowed_token_ids=[] must name at least one token id (None "
                                 "allows every token)")
            for i, t in enumerate(allowed):
                if not _is_token_id(t):
                    raise ValueError(f"allowed_token_ids[{i}]={short_repr(t)} must be a token "
                                     "id (an int >= 0, below the vocabulary's size)")
            self.allowed_token_ids = [int(t) for t in allowed]

    def _check_bad_words(self) -> None:
        """bad_words: a list of non-empty strings; bad_words_token_ids: a list of non-empty
        lists of token ids (the vocabulary bound is checked against the model, in
        `validation.validate_prompt`). Empty lists are stored as None."""
        if self.bad_words is not None:
            words = _as_list("bad_words", self.bad_words, "a list of non-empty strings (the "
                             "words that may not be generated), or None")
            for i, word in enumerate(words):
                if not isinstance(word, str) or not word:
                    raise ValueError(f"bad_words[{i}]={short_repr(word)} must be a non-empty "
                                     "string (bad_words is a list of words that may not be "
                                     "generated)")
            self.bad_words = words or None
        if self.bad_words_token_ids is not None:
            sequences = _as_list("bad_words_token_ids", self.bad_words_token_ids,
                                 "a list of non-empty lists of token ids, or None")
            normalized = []
            for i, seq in enumerate(sequences):
                ids = (list(seq) if hasattr(seq, "__iter__")
                       and not isinstance(seq, (str, bytes, dict)) else None)
                if not ids or not all(map(_is_token_id, ids)):
                    raise ValueError(f"bad_words_token_ids[{i}]={short_repr(seq)} must be a "
                                     "non-empty list of token ids (ints >= 0, below the "
                                     "vocabulary's size)")
                normalized.append([int(t) for t in ids])
            self.bad_words_token_ids = normalized or None

    def _check_beam_search(self) -> None:
        """A beam search scores the model's own log-probabilities: nothing that samples,
        penalizes or stops on anything but EOS and max_tokens goes with it."""
        beam = self.beam_search
        if not isinstance(beam, BeamSearchParams):
            raise ValueError(  # noqa: TRY004 - API contract: bad params are a ValueError
                f"beam_search={short_repr(beam)} must be a BeamSearchParams or None")
        if (self.n, self.max_tokens, self.ignore_eos) != (
                beam.beam_width, beam.max_tokens, beam.ignore_eos):
            raise ValueError(
                f"n={self.n}, max_tokens={self.max_tokens}, ignore_eos={self.ignore_eos} "
                f"differ from beam_search's beam_width={beam.beam_width}, max_tokens="
                f"{beam.max_tokens}, ignore_eos={beam.ignore_eos}; build the params with "
                "BeamSearchParams.to_sampling_params()")
        unsupported = [name for name, value, default in (
            ("temperature", self.temperature, 0.0), ("top_p", self.top_p, 1.0),
            ("min_p", self.min_p, 0.0), ("presence_penalty", self.presence_penalty, 0.0),
            ("frequency_penalty", self.frequency_penalty, 0.0),
            ("repetition_penalty", self.repetition_penalty, 1.0), ("seed", self.seed, None),
            ("min_tokens", self.min_tokens, 0), ("stop", self.stop, []),
            ("stop_token_ids", self.stop_token_ids, []), ("logprobs", self.logprobs, None),
            ("prompt_logprobs", self.prompt_logprobs, None),
            ("logit_bias", self.logit_bias, None),
            ("allowed_token_ids", self.allowed_token_ids, None),
            ("bad_words", self.bad_words, None),
            ("bad_words_token_ids", self.bad_words_token_ids, None))
            if value != default]
        if self.top_k not in (-1, 0):
            unsupported.insert(2, "top_k")
        if unsupported:
            raise ValueError(
                f"{unsupported[0]}={short_repr(getattr(self, unsupported[0]))} cannot go with beam "
                f"search (it scores the model's log-probabilities and stops only at EOS or "
                f"max_tokens); leave {', '.join(unsupported)} at the default")

    @property
    def greedy(self) -> bool:
        """Argmax instead of sampling: temperature 0, or below MIN_SAMPLING_TEMPERATURE (1e-5),
        where the limit of sampling is the argmax anyway and dividing by it is not safe."""
        return self.temperature < MIN_SAMPLING_TEMPERATURE

    @property
    def reads_output_tokens(self) -> bool:
        """Whether sampling needs the ids of the tokens generated so far (the penalties), which
        async scheduling does not have on the host while a step is in flight."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def adjusts_logits(self) -> bool:
        """Whether logit_bias, allowed_token_ids or bad words (`bad_words_token_ids`) change
        the logits before sampling."""
        return (self.logit_bias is not None or self.allowed_token_ids is not None
                or self.bad_words_token_ids is not None)


def check_truncate_prompt_tokens(value) -> None:
    """ValueError naming the field unless `value` is None, -1 or an int >= 1 (not a bool)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not (value == -1 or 1 <= value < 2**63)):
        raise ValueError(f"truncate_prompt_tokens={short_repr(value)} must be None (no "
                         "truncation), an int k from 1 to max_model_len (keep the prompt's "
                         "last k tokens) or -1 (keep the most that leave room for max_tokens)")


@dataclass(frozen=True)
class BeamSearchParams:
    """Settings of a beam search (vLLM's `BeamSearchParams`, plus HF's `early_stopping`).

    The search follows HF transformers' beam search (`generate(num_beams=beam_width,
    do_sample=False)`): each step expands every running beam, keeps the
    `max(2, 1 + number of EOS ids) * beam_width` best continuations by cumulative
    log-probability, finishes those among the first `beam_width` that end in EOS (or reach
    max_tokens), and runs on with the best `beam_width` that do not. docs/design.md, "Beam
    search", gives the rules and `pagedrt/core/beam.py` implements them.

    Attributes:
        beam_width: beams kept per step, and sequences returned (>= 1). Width 1 is greedy
            decoding.
        max_tokens: most tokens per sequence (>= 1).
        ignore_eos: EOS does not end a beam; every sequence runs to max_tokens.
        temperature: must be 0 (vLLM's default): beams are scored with the model's own
            log-probabilities.
        length_penalty: a finished sequence scores cumulative log-probability /
            (generated tokens ** length_penalty) (HF's definition; 1.0 = mean log-probability,
            0 = sum, > 0 favours longer sequences since log-probabilities are negative).
        early_stopping: HF's: True stops once `beam_width` sequences are finished; False
            (the default) also stops once the best running beam, scored at its current
            length, cannot beat the worst finished one; "never" estimates the best running
            score at max_tokens instead when length_penalty > 0.
        include_stop_str_in_output: accepted for vLLM compatibility; beam search has no stop
            strings.

    Raises:
        ValueError: from `__post_init__`, naming the field and the allowed values.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        _check_int("beam_width", self.beam_width, 1)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_number("temperature", self.temperature)
        if self.temperature != 0:
            raise ValueError(
                f"temperature={short_repr(self.temperature)}: beam search is deterministic here "
                "(beams are scored with the model's log-probabilities); use temperature=0")
        _check_number("length_penalty", self.length_penalty)
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"early_stopping={short_repr(self.early_stopping)} must be True, False "
                             "or 'never'")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            _check_bool(name, getattr(self, name))

    def to_sampling_params(self) -> SamplingParams:
        """The SamplingParams the engine runs this search with (n = beam_width, greedy)."""
        return SamplingParams(n=self.beam_width, temperature=0.0, max_tokens=self.max_tokens,
                              ignore_eos=self.ignore_eos, beam_search=self)


def _is_token_id(value) -> bool:
    """An int (numpy's too, not a bool) in [0, 2**63): what logit_bias keys, allowed_token_ids
    and bad_words_token_ids hold (the vocabulary bound is the model's:
    `validation.validate_prompt`)."""
    return (not isinstance(value, bool) and isinstance(value, numbers.Integral)
            and 0 <= value < 2**63)


def _as_list(name: str, value, expected: str) -> list:
    """`value` (None, or a list, tuple or other iterable that is not a str, bytes or dict)
    as a list; ValueError naming the value otherwise (stop=5 would otherwise fail with
    "'int' object is not iterable")."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name}={short_repr(value)} must be {expected}")
    return list(value)


def _as_output_kind(value) -> RequestOutputKind:
    """`value` (a RequestOutputKind, or a member's name in any case) as a RequestOutputKind;
    ValueError naming the value and the allowed ones otherwise."""
    if isinstance(value, RequestOutputKind):
        return value
    if isinstance(value, str) and value.upper() in RequestOutputKind.__members__:
        return RequestOutputKind[value.upper()]
    allowed = ", ".join(repr(name.lower()) for name in RequestOutputKind.__members__)
    raise ValueError(f"output_kind={short_repr(value)} must be a RequestOutputKind or one of "
                     f"{allowed}")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={short_repr(value)} must be True or False")  # noqa: TRY004


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={short_repr(value)} must be an int >= {minimum}")  # noqa: TRY004
    if value < minimum:
        raise ValueError(f"{name}={short_repr(value)} must be >= {minimum}")


def _check_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={short_repr(value)} must be a number")  # noqa: TRY004
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond float's range (10**400)
        finite = False
    if not finite:
        raise ValueError(f"{name}={short_repr(value)} must be a finite number (not NaN or infinity)")


def short_text(text: str) -> str:
    """`text`, cut to its first 64 characters and "..." where longer (no message echoes a huge
    input back)."""
    return text if len(text) <= 64 else text[:64] + "..."


def short_repr(value) -> str:
    """repr(value), at most about 64 characters (`short_text`)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        return f"<an int of about {int(value.bit_length() * 0.30103)} digits>"
    return short_text(repr(value))
