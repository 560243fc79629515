"""SpeculativeConfig: how the engine proposes and verifies draft tokens (vLLM's names).

    LLM(..., speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                                 "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    LLM(..., speculative_config={"method": "draft_model", "model": "small.gguf",
                                 "num_speculative_tokens": 4})

The switch-off rule (`disable_by_batch_size`): a step speculates only while the engine holds
at most that many unfinished sequences (running, waiting and swapped). Why a batch bound: a
verification step computes 1 + k tokens per sequence where a decode step computes 1, and it
must run synchronously (the next step's positions depend on how many drafts were accepted;
docs/design.md). At batch 1 the forward pass costs about the same for 1 or 1 + k tokens (it is
bound by reading the weights and by kernel launches), so every accepted draft is a token for
free; at large batches a decode step already keeps the GPU's matmul units busy, the extra
tokens cost their full price, and losing the async overlap adds the host's step time (1.0 to
1.2 ms for a 256-row decode step on the H200, BENCHMARKS.md). The default, 32 sequences, keeps
a verification step of k = 5 at 192 tokens, near the ~190 tokens per step below which the
H200's bf16 matmuls are bound by reading the weights (measured 790 TFLOP/s over 4.15 TB/s, ~190
FLOP per byte; a token costs 2 FLOP per 2-byte weight). `benchmarks/spec_h200.sh` measures
speculation on against off at batch 1 and at 256 concurrent requests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

SPECULATIVE_METHODS = ("ngram", "draft_model")
DEFAULT_DISABLE_BY_BATCH_SIZE = 32
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
            unfinished sequences (default 32; see the module docstring for why).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | object | None = None
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config method={self.method!r}; use one of "
                             f"{', '.join(repr(m) for m in SPECULATIVE_METHODS)}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        _check_int("disable_by_batch_size", self.disable_by_batch_size, 1)
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
        for name in ("method", "num_speculative_tokens"):
            if name not in value:
                raise ValueError(f"speculative_config needs {name!r} (keys: {names})")
        return cls(**value)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"speculative_config {name}={value!r} must be an int >= {minimum}")
