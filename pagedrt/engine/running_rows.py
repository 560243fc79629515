"""RunningRows: the scheduler's running sequences as arrays, for the steady decode step.

Most steps of a busy engine are steady decodes: the same sequences as in the last step, each
computing its one last token. `Scheduler.schedule` and `Scheduler.update` then do per-row
numpy instead of Python per request (docs/design.md, "Host work per step"). This snapshot
holds what does not change while a sequence runs (its id, prompt length, max_tokens, stop
ids, how its tokens are reported), gathered in one pass over `Scheduler.running` when that
list changes (a sequence joined, left or moved), and reused while it does not.

What does change every step (computed tokens, output length) is read from the requests each
step (`gather_counts`, two list comprehensions): the requests stay the one record of
progress, and no copy of it can go stale. (On CPython 3.11 a comprehension or loop that reads
or writes one attribute per object costs about 10-20 ns per object, less than `map` over
`attrgetter`/`setattr`; what costs is a Python call per object, which these paths avoid.)
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from pagedrt.core.request import Request

_REQUEST_ID = attrgetter("request_id")
_PROMPT = attrgetter("prompt_token_ids")
_MAX_TOKENS = attrgetter("params.max_tokens")
_STOP_SET = attrgetter("stop_token_set")


def _quiet(req: Request) -> bool:
    """Whether `update` writes this sequence's tokens with nothing of its own to do per token
    but a possible stop: no text to detokenize as it goes (streamed text, stop strings), no
    logprobs, not a beam slot. (One call per sequence when the running list changes.)"""
    return (req.beam is None and req.params.logprobs is None
            and not (req.detokenizer is not None and (req.stream or req.params.stop)))


class RunningRows:
    """A snapshot of `Scheduler.running` (see the module docstring).

    Attributes:
        requests: the running sequences, in order (a copy of the list).
        req_ids: their ids.
        num_prompt_tokens: [n] int64 prompt lengths.
        max_tokens: [n] int64 each one's `max_tokens`.
        stop_token_ids: [m] int64, sorted: every id in some sequence's `stop_token_set` (a
            token among them may stop its sequence; `update` checks those rows one by one).
        quiet: [n] bool, see `_quiet`.
        streamed: [n] bool, reported every step (`Request.stream`; outside token-event mode
            such a sequence is also written one by one).
        head_ids, sample_indices: each one's request id (its group's first sequence's) and
            sample index, for its TokenEvents.
        decodable: every sequence is forked (its n samples exist) and none is a beam slot:
            a step in which each computes one token needs no per-request decision.
    """

    def __init__(self, running: list[Request]) -> None:
        self.requests = list(running)
        n = len(running)
        self.req_ids = list(map(_REQUEST_ID, running))
        self.num_prompt_tokens = np.fromiter(map(len, map(_PROMPT, running)), np.int64, n)
        self.max_tokens = np.fromiter(map(_MAX_TOKENS, running), np.int64, n)
        self.stop_token_ids = np.array(sorted(frozenset().union(*map(_STOP_SET, running))),
                                       dtype=np.int64)
        self.quiet = np.fromiter(map(_quiet, running), np.bool_, n)
        self.streamed = np.fromiter(map(attrgetter("stream"), running), np.bool_, n)
        self.head_ids = [r.group[0].request_id for r in running]
        self.sample_indices = [r.sample_index for r in running]
        self.decodable = all(map(attrgetter("forked"), running)) and all(
            r.beam is None for r in running)

    def matches(self, running: list[Request]) -> bool:
        """Whether `running` holds the same sequences in the same order (identity: C-level
        list comparison, whose per-item identity check never calls `__eq__`)."""
        return self.requests == running

    def gather_counts(self) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
        """(each sequence's output_token_ids list, [n] int64 their lengths, [n] int64 their
        num_computed_tokens), read from the requests now."""
        requests = self.requests
        outputs = [r.output_token_ids for r in requests]
        num_output = np.array([len(o) for o in outputs], dtype=np.int64)
        computed = np.array([r.num_computed_tokens for r in requests], dtype=np.int64)
        return outputs, num_output, computed

