"""RunningRows: the scheduler's running sequences as arrays, for the steady decode step.

Most steps of a busy engine are steady decodes: the same sequences as in the last step, each
computing its one last token. `Scheduler.schedule` and `Scheduler.update` then do numpy over
the rows instead of a Python call per request (docs/design.md, "Host work per step"). This
snapshot holds what does not change while a sequence runs (its id, prompt length, max_tokens,
stop ids, how its tokens are reported). It is made again, in one pass of list comprehensions
(about 55 us for 256 sequences on the 2-core CPU of docs/design.md's figures), when
`Scheduler.running` changes: a sequence joined, left or moved. (Copying the rows of the
sequences an older snapshot held instead cost as much: mapping each sequence to its old row
takes about as long as reading its four fields again.)

What does change every step (computed tokens, output length) is read from the requests each
step (`gather_counts`, two list comprehensions): the requests stay the one record of
progress, and no copy of it can go stale. (On CPython 3.11 a comprehension or loop that reads
or writes one attribute per object costs about 10-20 ns per object, less than `map` over
`attrgetter`/`setattr`; what costs is a Python call per object, which these paths avoid.)
"""

from __future__ import annotations

import functools

import numpy as np

from pagedrt.core.request import Request


class RunningRows:
    """A snapshot of `Scheduler.running` (see the module docstring).

    Attributes:
        requests: the running sequences, in order (a copy of the list).
        req_ids: their ids.
        num_prompt_tokens: [n] int64 prompt lengths.
        max_tokens: [n] int64 each one's `max_tokens`.
        quiet: [n] bool, `update` writes the sequence's tokens with nothing of its own to do
            per token but a possible stop: no text to detokenize as it goes (streamed text,
            stop strings), no logprobs, not a beam slot.
        streamed: [n] bool, reported every step (`Request.stream`; outside token-event mode
            such a sequence is also written one by one).
        stop_token_ids: [m] int64, sorted: every id in some sequence's `stop_token_set` (a
            token among them may stop its sequence; `update` checks those rows one by one).
        decodable: every sequence is forked (its n samples or a beam search's W slots
            exist): a step in which each computes one token needs no per-request decision.
        is_beam: [n] bool, a beam search's slot (its tokens are written by
            `BeamScheduling.update`, never one by one).
        beam_heads: [b] int64 the rows of beam searches' first slots (`Scheduler._advance`
            hands their searches to the step's beam expansion), in row order.
        multi_step: [n] bool, the sequence may take part in a multi-step decode (not a beam
            slot, no bad words: what the device side needs the host for between two passes;
            docs/design.md, "Multi-step decode"). Made on first use: only an engine with
            num_scheduler_steps > 1 reads it.
    """

    def __init__(self, running: list[Request]) -> None:
        self.requests = requests = list(running)
        self.req_ids = [r.request_id for r in requests]
        params = [r.params for r in requests]
        self.num_prompt_tokens = np.array([len(r.prompt_token_ids) for r in requests],
                                          dtype=np.int64)
        self.max_tokens = np.array([p.max_tokens for p in params], dtype=np.int64)
        self.is_beam = np.array([r.beam is not None for r in requests], dtype=np.bool_)
        self.quiet = ~self.is_beam & np.array(
            [p.logprobs is None and not (r.detokenizer is not None and (r.stream or p.stop))
             for r, p in zip(requests, params)], dtype=np.bool_)
        self.streamed = np.array([r.stream for r in requests], dtype=np.bool_)
        self.stop_token_ids = np.array(
            sorted(frozenset().union(*[r.stop_token_set for r in requests])), dtype=np.int64)
        self.decodable = all(r.forked for r in requests)
        self.beam_heads = np.flatnonzero(
            self.is_beam & np.array([r.sample_index == 0 for r in requests], dtype=np.bool_))
        self._event_keys: tuple[list[str], list[int]] | None = None

    @functools.cached_property
    def multi_step(self) -> np.ndarray:
        return ~self.is_beam & np.array(
            [not p.bad_words and not p.bad_words_token_ids
             for p in (r.params for r in self.requests)], dtype=np.bool_)

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
