"""Result objects, shaped like vLLM's so code can switch between the two."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from pagedrt.engine.sampler import TokenLogprobs


@dataclass
class CompletionOutput:
    """One of the n samples of a request.

    `text`, `token_ids` and `logprobs` hold the whole output so far, except for a request
    streamed with SamplingParams.output_kind DELTA (`RequestOutputKind`), where they hold only
    what this output adds to the sample's previous one (then equal to `delta_text` and
    `delta_token_ids`).

    Attributes:
        index: which sample (0 .. n-1).
        text: generated text so far (stop strings excluded).
        token_ids: generated token ids so far (an EOS or stop token id that ended it included).
        finish_reason: "stop", "length", "abort" or None while running.
        stop_reason: the stop string or stop token id that ended it, if any.
        logprobs: per generated token, its `TokenLogprobs` (pagedrt/engine/sampler.py: the
            token_id, its logprob and rank, and top_logprobs, the SamplingParams.logprobs most
            likely (token_id, logprob) pairs), when SamplingParams.logprobs was set.
        delta_text, delta_token_ids: what this output added to the sample's previous one (for
            streaming; everything, in the first or only output).
        cumulative_logprob: the sum of the generated tokens' log-probabilities (each under
            the raw model distribution, as in `logprobs`; the whole sum whatever the output
            kind): a beam search's sequence, or a sample when SamplingParams.logprobs was set;
            None for a sample without it.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list | None = None  # of TokenLogprobs
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its samples.

    Attributes:
        request_id: the id given at submission.
        prompt: the prompt text (None when given as token ids).
        prompt_token_ids: the prompt as token ids.
        outputs: one CompletionOutput per sample.
        finished: all samples finished.
        num_cached_tokens: prompt tokens served from the prefix cache at admission.
        metrics: arrival, first-token and finish times (seconds, time.monotonic()).
        prompt_logprobs: when SamplingParams.prompt_logprobs was set, one entry per prompt
            token: None for the first (nothing comes before it), then its `TokenLogprobs`
            under the raw model distribution given the tokens before it (token_id: the
            prompt token, its logprob and rank, top_logprobs: the prompt_logprobs most likely
            (token_id, logprob) pairs at its position, most likely first); a one-token
            prompt gives [None]. None when not asked. It is in every output of a request
            (CUMULATIVE, and the one FINAL_ONLY or `LLM.generate` output) except with
            output_kind DELTA, where only the first output has it (docs/design.md, "Request
            lifecycle").
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)
    prompt_logprobs: list | None = None  # of TokenLogprobs (None first)


class TokenEvent(NamedTuple):
    """One sampled token of one sequence, as the engine core reports it (plain data).

    Attributes:
        request_id: the request (all n samples share it).
        sample_index: which of the n samples.
        token_id: the token.
        logprobs: its TokenLogprobs when the request asked for logprobs, else None.
        finish_reason: "stop" or "length" when this token ended the sample, else None.
        stop_reason: the stop string or stop token id that ended it, if any.
    """

    request_id: str
    sample_index: int
    token_id: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None


class PromptLogprobsEvent(NamedTuple):
    """Prompt logprobs of one step of one request, as the engine core reports them (plain
    data; typed in msgspec msgpack).

    Attributes:
        request_id: the request.
        logprobs: a TokenLogprobs per prompt position the step computed, in order, each
            following those of the request's earlier events (the first prompt token, which
            has none, is never sent).
    """

    request_id: str
    logprobs: list[TokenLogprobs]


@dataclass
class BeamSearchSequence:
    """One sequence of a beam search's result (vLLM's shape, plus `score`).

    Attributes:
        tokens: the prompt's token ids, then the generated ones (an EOS that ended it
            included).
        logprobs: per-token logprobs; empty (not computed for beam search).
        cum_logprob: the sum of the generated tokens' log-probabilities.
        score: cum_logprob / (generated tokens ** length_penalty): what ranks the sequences
            (HF transformers' `sequences_scores`).
        text: the decoded tokens, prompt included (as vLLM's `LLM.beam_search`), special
            tokens left out.
        finish_reason: "stop" (EOS) or "length" (max_tokens).
        stop_reason: always None (beam search has no stop strings).
    """

    tokens: list[int]
    logprobs: list = field(default_factory=list)
    cum_logprob: float = 0.0
    score: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """A beam search's result: its sequences, best first (vLLM's shape)."""

    sequences: list[BeamSearchSequence]
