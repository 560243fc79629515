"""RunningRows: the scheduler's running sequences as arrays, for the steady decode step.

Most steps of a busy engine are steady decodes: the same sequences as in the last step, each
computing its one last token. `Scheduler.schedule` and `Scheduler.update` then do numpy over
the rows instead of a Python call per request (docs/design.md, "Host work per step"). This
snapshot holds what does not change while a sequence runs (its id, prompt length, max_tokens,
stop ids, how its tokens are reported). It is made again when `Scheduler.running` changes (a
sequence joined, left or moved), from the previous snapshot: the rows of sequences it held
are copied (numpy gathers), only the sequences that joined are read.

What does change every step (computed tokens, output length) is read from the requests each
step (`gather_counts`, two list comprehensions): the requests stay the one record of
progress, and no copy of it can go stale. (On CPython 3.11 a comprehension or loop that reads
or writes one attribute per object costs about 10-20 ns per object, less than `map` over
`attrgetter`/`setattr`; what costs is a Python call per object, which these paths avoid.)
"""

from __future__ import annotations

import numpy as np

from pagedrt.core.request import Request


def _quiet(req: Request) -> bool:
    """Whether `update` writes this sequence's tokens with nothing of its own to do per token
    but a possible stop: no text to detokenize as it goes (streamed text, stop strings), no
    logprobs, not a beam slot."""
    return (req.beam is None and req.params.logprobs is None
            and not (req.detokenizer is not None and (req.stream or req.params.stop)))


class RunningRows:
    """A snapshot of `Scheduler.running` (see the module docstring).

    Attributes:
        requests: the running sequences, in order (a copy of the list).
        req_ids: their ids.
        num_prompt_tokens: [n] int64 prompt lengths.
        max_tokens: [n] int64 each one's `max_tokens`.
        quiet: [n] bool, see `_quiet`.
        streamed: [n] bool, reported every step (`Request.stream`; outside token-event mode
            such a sequence is also written one by one).
        stop_token_ids: [m] int64, sorted: every id in some sequence's `stop_token_set` (a
            token among them may stop its sequence; `update` checks those rows one by one).
        decodable: every sequence is forked (its n samples exist) and none is a beam slot:
            a step in which each computes one token needs no per-request decision.
    """

    def __init__(self, running: list[Request], previous: RunningRows | None = None) -> None:
        """previous: an older snapshot, whose rows of sequences still running are reused."""
        self.requests = requests = list(running)
        n = len(requests)
        self.req_ids = [r.request_id for r in requests]
        self._event_keys: tuple[list[str], list[int]] | None = None
        self.stop_token_ids = np.array(
            sorted(frozenset().union(*[r.stop_token_set for r in requests])), dtype=np.int64)
        # (a sequence is forked once, when its prompt completes: read again every time)
        self.decodable = all(r.forked and r.beam is None for r in requests)
        # the per-row constants: copied from `previous` where it holds the sequence
        old = np.full(n, -1, dtype=np.int64)
        if previous is not None and previous.requests:
            row_of = {id(r): i for i, r in enumerate(previous.requests)}
            old[:] = [row_of.get(id(r), -1) for r in requests]
            keep = np.maximum(old, 0)
            self.num_prompt_tokens = previous.num_prompt_tokens[keep]
            self.max_tokens = previous.max_tokens[keep]
            self.quiet = previous.quiet[keep]
            self.streamed = previous.streamed[keep]
        else:
            self.num_prompt_tokens = np.zeros(n, dtype=np.int64)
            self.max_tokens = np.zeros(n, dtype=np.int64)
            self.quiet = np.zeros(n, dtype=np.bool_)
            self.streamed = np.zeros(n, dtype=np.bool_)
        for i in np.flatnonzero(old < 0).tolist():  # sequences that joined
            r = requests[i]
            self.num_prompt_tokens[i] = len(r.prompt_token_ids)
            self.max_tokens[i] = r.params.max_tokens
            self.quiet[i] = _quiet(r)
            self.streamed[i] = r.stream

    def event_keys(self) -> tuple[list[str], list[int]]:
        """Each sequence's request id (its group's first sequence's) and sample index, the
        first two fields of its TokenEvents (made on first use)."""
        if self._event_keys is None:
            self._event_keys = ([r.group[0].request_id for r in self.requests],
                                [r.sample_index for r in self.requests])
        return self._event_keys

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
