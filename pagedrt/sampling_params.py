"""SamplingParams: per-request decoding settings, with vLLM's names and defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Temperatures below this are greedy (as vLLM's _SAMPLING_EPS): dividing float32 logits by a
# smaller one can overflow to inf, and inf - inf in the softmax is NaN.
MIN_SAMPLING_TEMPERATURE = 1e-5


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
            the same batch.
        max_tokens: most tokens to generate (>= 1).
        min_tokens: EOS and stop token ids are suppressed until this many tokens were generated.
        stop: strings that end generation; the matched string is not part of the output text.
        stop_token_ids: token ids that end generation (besides EOS unless ignore_eos).
        ignore_eos: keep generating past EOS until max_tokens.
        logprobs: return the log-probabilities of this many top tokens per step (None: none).
        skip_special_tokens: drop special tokens from the output text.
        include_stop_str_in_output: keep the matched stop string in the text.

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
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check_int("n", self.n, 1)
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(
                f"temperature={_short(self.temperature)} must be >= 0 (0 means greedy)")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={_short(self.top_p)} must be in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(  # noqa: TRY004 - API contract: bad params are a ValueError
                f"top_k={_short(self.top_k)} must be an int (-1 or 0 disables it)")
        if self.top_k < -1:
            raise ValueError(
                f"top_k={_short(self.top_k)} must be -1 (disabled), 0 (disabled) or >= 1")
        _check_number("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p={_short(self.min_p)} must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name}={_short(value)} must be in [-2, 2]")
        _check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty={_short(self.repetition_penalty)} must be > 0")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise ValueError(f"seed={_short(self.seed)} must be an int or None")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed={_short(self.seed)} must be in [-2**63, 2**63) (a 64-bit int)")
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop={_short(self.stop)} must be a list of non-empty strings")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids={_short(self.stop_token_ids)} must be non-negative ints")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0)
            if self.logprobs > 20:
                raise ValueError(f"logprobs={self.logprobs} must be at most 20")

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


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={_short(value)} must be an int >= {minimum}")  # noqa: TRY004
    if value < minimum:
        raise ValueError(f"{name}={_short(value)} must be >= {minimum}")


def _check_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={_short(value)} must be a number")  # noqa: TRY004
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond float's range (10**400)
        finite = False
    if not finite:
        raise ValueError(f"{name}={_short(value)} must be a finite number (not NaN or infinity)")


def _short(value) -> str:
    """repr(value), at most about 64 characters (no message echoes a huge input back)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        return f"<an int of about {int(value.bit_length() * 0.30103)} digits>"
    text = repr(value)
    return text if len(text) <= 64 else text[:64] + "..."
