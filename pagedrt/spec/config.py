"""SpeculativeConfig: how the engine proposes and verifies draft tokens (vLLM's names).

    LLM(..., speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                                 "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    LLM(..., speculative_config={"method": "draft_model", "model": "small.gguf",
                                 "num_speculative_tokens": 4})

Two switch-off rules. Why speculation can lose: a verification step computes 1 + k tokens per
sequence where a decode step computes 1, and it must run synchronously (the next step's
positions depend on how many drafts were accepted; docs/design.md). At batch 1 the forward pass
costs about the same for 1 or 1 + k tokens (it is bound by reading the weights and by kernel
launches), so every accepted draft is a token for free; as the batch grows, the extra tokens
and the lost async overlap (the host's step time is no longer hidden) cost more than the
accepted drafts give.

1. `disable_by_batch_size`: a step speculates only while the engine holds at most that many
   unfinished sequences (running, waiting and swapped). The default, 4, comes from a
   measurement on the H200 with the real SmolLM2-135M (bf16, CUDA graphs, n-gram k = 5,
   n 2..4, the text workload of `benchmarks/spec_h200.sh`): speculation forced on at every
   batch size gave 0.85x the throughput of speculation off at 8 concurrent requests, 0.96x at
   16, 0.62x at 32, 0.65x at 64 and 128 (benchmarks/results/RUNS.md, "Second runs of
   2026-12-01 (11:20-11:40 UTC)"), while batch 1 gained 1.88x and 2.25x on text that repeats
   its prompt. Batches 2 and 4 were not in that sweep. A later sweep (both rules off; the same
   file's "Night runs of 2026-12-01 (23:05-23:42 UTC)", one run per point, and engines of one
   commit differ by up to ~15% from run to run there) gave 1.99x at 1, 0.97x at 2, 0.83x at
   4, 0.72x at 8, 0.77x at 16, 0.49x at 32, 0.44x at 64 and 128: with the per-sequence rule
   off, 4 is past the break-even; the bound stays 4 until a sweep with that rule on (the
   default) says where it lies. Since verification graphs attend with decode rows ("Runs of
   2026-12-02 (00:50-01:45 UTC)" there, k = 10, n 2..5, rules off) the sweep gave 4.22x at 1,
   1.35x at 2, 1.12x at 4, 1.09x at 8, 0.88x at 16, 0.85x at 32: 4 is now on the safe side of
   the break-even.
   With the former default, 32, 256 concurrent requests ran at 0.869x of off: the tail of the
   run speculated at batches where it loses, and the first verification step paid a one-time
   ~138 ms (the rejection sampler's kernels loaded on first use, ~97 ms, now run at start-up
   by `ModelRunner.warm_up_speculation`; the n-gram index built token by token, ~28 ms, now
   in one pass, pagedrt/spec/ngram.py).
2. `min_mean_accepted_length`: per sequence, a sequence whose mean accepted length over its
   latest verification steps falls below this bound pauses speculation, with exponential
   backoff (pagedrt/spec/acceptance.py). On the same H200 run, the one batch-1 prompt that
   lost (0.95x of off) had a mean accepted length of 1.76; those that gained had 3.6 to 5.9.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

SPECULATIVE_METHODS = ("ngram", "draft_model")
DEFAULT_DISABLE_BY_BATCH_SIZE = 4  # measured; see the module docstring
DEFAULT_MIN_MEAN_ACCEPTED_LENGTH = 2.0
DEFAULT_PROMPT_LOOKUP = 5  # n-gram size when neither bound is given


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    Attributes:
        method: "ngram" (prompt lookup: the tokens that followed an earlier occurrence of the
            sequence's last n tokens, in its prompt or its output) or "draft_model" (a smaller
            model with the same vocabulary proposes greedily).
        num_speculative_tokens: k, the most draft tokens proposed and verified per sequence
            and step (>= 1).
        prompt_lookup_min, prompt_lookup_max: n-gram sizes tried, longest first (ngram only;
            1 <= min <= max). Neither given: both 5; one given: the other takes its value.
        model: path of the draft model, a .gguf file or a Hugging Face folder (draft_model
            only); its vocabulary size must equal the target's. A `LoadedModel` (from
            `pagedrt.models.loader.load_model`) also works, as for `LLM(model=...)`.
        disable_by_batch_size: a step speculates only while the engine holds at most this many
            unfinished sequences (default 4; see the module docstring for the measurement).
        min_mean_accepted_length: a sequence whose mean accepted length (accepted drafts + 1
            per verification step) over its latest verification steps is below this pauses
            speculation for 8, 16, 32, ... (at most 256) engine steps
            (pagedrt/spec/acceptance.py). A number in [0, num_speculative_tokens + 1]; 1 or
            less never pauses. Default 2.0: on average at least one draft accepted per step
            (with k = 1 that is every draft: lower it there to keep speculating through
            occasional rejections).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | object | None = None
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE
    min_mean_accepted_length: float = DEFAULT_MIN_MEAN_ACCEPTED_LENGTH

    def __post_init__(self) -> None:
        _check_method(self.method)
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        _check_int("disable_by_batch_size", self.disable_by_batch_size, 1)
        bound, top = self.min_mean_accepted_length, self.num_speculative_tokens + 1
        if (isinstance(bound, bool) or not isinstance(bound, (int, float))
                or not 0 <= bound <= top):
            raise ValueError(
                f"speculative_config min_mean_accepted_length={bound!r} must be a number in "
                f"[0, {top}] (num_speculative_tokens + 1 is the most tokens a verification "
                f"step gives; 1 or less never pauses speculation)")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is None and hi is None:
                lo = hi = DEFAULT_PROMPT_LOOKUP
            lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
            _check_int("prompt_lookup_min", lo, 1)
            _check_int("prompt_lookup_max", hi, 1)
            if lo > hi:
                raise ValueError(f"speculative_config prompt_lookup_min={lo} > "
                                 f"prompt_lookup_max={hi}; the minimum must not exceed it")
            object.__setattr__(self, "prompt_lookup_min", lo)
            object.__setattr__(self, "prompt_lookup_max", hi)
            if self.model is not None:
                raise ValueError("speculative_config 'model' is for method 'draft_model'; "
                                 "method 'ngram' needs no model")
        else:
            loaded = hasattr(self.model, "model_config") and hasattr(self.model, "model")
            if not loaded and (not isinstance(self.model, str) or not self.model):
                raise ValueError("speculative_config method 'draft_model' needs 'model': the "
                                 "path of the draft model (.gguf or Hugging Face folder)")
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError("speculative_config prompt_lookup_min/max are for method "
                                 "'ngram'; leave them out with 'draft_model'")

    @classmethod
    def from_dict(cls, value: dict | SpeculativeConfig) -> SpeculativeConfig:
        """Build from `LLM(speculative_config=...)`'s dict (or return a config as is).

        Raises:
            ValueError: not a dict, a key that is not a field (the message lists them), a
                missing method or num_speculative_tokens, or a bad value.
        """
        if isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
                f"speculative_config must be a dict such as {{'method': 'ngram', "
                f"'num_speculative_tokens': 5}}, got {type(value).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"speculative_config has unknown key(s) {unknown}; the keys are "
                             f"{names}")
        if "method" not in value:
            raise ValueError(f"speculative_config needs 'method' (keys: {names})")
        _check_method(value["method"])  # (named before the keys it would need)
        if "num_speculative_tokens" not in value:
            raise ValueError(f"speculative_config needs 'num_speculative_tokens' (keys: {names})")
        return cls(**value)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_method(method) -> None:
    if method not in SPECULATIVE_METHODS:
        raise ValueError(f"speculative_config method={method!r}; use one of "
                         f"{', '.join(repr(m) for m in SPECULATIVE_METHODS)}")


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"speculative_config {name}={value!r} must be an int >= {minimum}")
