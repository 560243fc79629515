"""Request: one sequence being generated, and the counters the scheduler drives.

Token regions of a request at the start of a step:

    |<------------- num_tokens = prompt + generated so far ------------->|
    |<---- num_computed_tokens (KV in the cache) ---->|<- to compute ->|
                                                       ^ this step schedules a chunk of these

A step that brings num_computed_tokens up to num_tokens yields logits for the next token.
Prefill, chunked prefill, prefix-cache hits, resumption after preemption and decode are all
this one rule.
"""

from __future__ import annotations

import enum
import itertools
import time

import numpy as np

from pagedrt.core.beam import BeamGroup
from pagedrt.sampling_params import SamplingParams

_arrival_counter = itertools.count()

PLACEHOLDER_TOKEN_ID = -1
"""Stands at the end of `output_token_ids` for a token that the in-flight step is still
sampling (async scheduling, see `LLMEngine.step`); the engine writes the real id over it."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        # `_value_` is a plain attribute; `value` goes through a descriptor, slow per token
        return self._value_ in _FINISHED_VALUES


_FINISHED_VALUES = frozenset(("stop", "length", "abort"))


class Request:
    """A sequence: prompt token ids, generated token ids and scheduling state.

    A request with `params.n > 1` is forked into n sequences (sharing the prompt's KV blocks)
    when its prefill completes; `sample_index` says which of the n samples a sequence is and
    `group` holds all n of them (in order) on every member. A beam search forks the same way
    into its W beam slots, which `beam` (the search's state) ties together.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        priority: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        # every attribute is set here, none later: instances then share one key layout, which
        # keeps CPython's attribute access fast (a lazily added one, as functools.cached_property
        # does, made every step's per-request loops about 15% slower)
        self._prompt_array: np.ndarray | None = None  # see prompt_array
        self.output_token_ids: list[int] = []
        # how many of output_token_ids, at its end, are placeholders for tokens still being
        # sampled (the device side knows where they are): the step in flight's (one, or one per
        # pass of a multi-step plan) and, with async scheduling, those of the plan made since;
        # 0 once every token is written
        self.num_pending_tokens = 0
        self.output_logprobs: list = []
        # SamplingParams.prompt_logprobs: one entry per prompt token as they come back (None
        # for the first, then a TokenLogprobs each), on the sequence that computes the prompt;
        # None when not asked. `num_prompt_logprobs_planned`: prompt positions a plan has
        # asked for so far (position p gives prompt token p + 1's entry), which a recompute
        # after a preemption does not lower: no entry is sent twice (docs/design.md, "Request
        # lifecycle")
        self.prompt_logprobs: list | None = None if params.prompt_logprobs is None else [None]
        self.num_prompt_logprobs_planned = 0
        self.prompt_logprobs_reported = False  # (DELTA outputs hold them once)
        # the sum of output_logprobs' chosen-token logprobs, kept by `append_logprob` (a
        # streamed request reports it every step: summing the list each time was quadratic)
        self.cumulative_logprob = 0.0
        self.params = params
        self.priority = priority
        self.eos_token_ids = eos_token_ids
        # tokens that may end the request: only these, the last allowed token and stop strings
        # need the full stop check (`LLMEngine._check_stop`) after a token is sampled
        self.stop_token_set = frozenset(params.stop_token_ids).union(
            () if params.ignore_eos else eos_token_ids)
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.arrival_seq = next(_arrival_counter)
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prompt tokens hit in the prefix cache at admission
        self.stop_reason: int | str | None = None
        self.sample_index = 0
        self.group: list[Request] = [self]
        # a beam search's shared state (pagedrt/core/beam.py), on every slot; None: sampling
        self.beam: BeamGroup | None = None
        self.forked = params.n == 1
        self.stream = True  # report every step (see LLMEngine.add_request)
        # generated tokens already in an output that `LLMEngine.step()` returned (where the
        # next output's delta starts); a forked sample starts at 0, with no token of its own
        self.num_reported_tokens = 0
        self.detokenizer = None  # set by the engine: IncrementalDetokenizer
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_known_tokens(self) -> int:
        """num_tokens without the placeholder of a token still being sampled."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.num_pending_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole list."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def prompt_array(self) -> np.ndarray:
        """The prompt as [num_prompt_tokens] int64, for slices without per-token Python (block
        hashes, the inputs of prefill steps); built on first use, at admission."""
        if self._prompt_array is None:
            self._prompt_array = np.asarray(self.prompt_token_ids, dtype=np.int64)
        return self._prompt_array

    def token_array(self, start: int, end: int) -> np.ndarray:
        """all_token_ids[start:end] as int64 (a view of `prompt_array` within the prompt)."""
        if end <= len(self.prompt_array):
            return self.prompt_array[start:end]
        return np.asarray(self.token_ids_slice(start, end), dtype=np.int64)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether prompt positions are left whose logprobs no plan has asked for yet (such a
        request takes no prefix-cache hit: cached positions have no logits)."""
        return (self.prompt_logprobs is not None
                and self.num_prompt_logprobs_planned < len(self.prompt_token_ids) - 1)

    def append_logprob(self, logprob) -> None:
        """Record a sampled token's logprobs (an object whose `.logprob` is the chosen
        token's) and add that to `cumulative_logprob`."""
        self.output_logprobs.append(logprob)
        self.cumulative_logprob += logprob.logprob

    @property
    def is_finished(self) -> bool:
        return self.status._value_ in _FINISHED_VALUES  # as status.finished, one call less

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Lower is more important: (priority, arrival order, sample index): the samples of a
        request stay together, in order. Preemption takes the highest."""
        return (self.priority, self.arrival_seq, self.sample_index)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, computed="
            f"{self.num_computed_tokens}/{self.num_tokens})"
        )
