"""The scheduler's part of beam search (docs/design.md, "Beam search"): the W slots of a search
are scheduled, allocated, preempted, admitted and updated as one.

A beam search runs as W sequences ("slots", `Request.sample_index`, all sharing `Request.beam`)
that sit next to each other in the scheduler's queues. The device expands all W together, so
the slots move as one:

- tokens: they complete their tokens in the same step or none does (`hold_completions`);
- blocks: blocks for all of them are found before any is allocated, preempting the least
  important running requests (or the search itself) until they fit (`allocate`);
- preemption: takes the whole search, always by recompute (`Scheduler._preempt`: a
  per-sequence swap would copy the blocks the slots share once per slot, and the prefix cache
  shares them again when the slots come back);
- admission: a preempted search comes back whole, or not at all (`admit`);
- update: each step's expansion is replayed on the host (HF's bookkeeping,
  `pagedrt/core/beam.py`), the slots' tokens and block tables follow the beams they now hold,
  and a search that is done finishes every slot (`update`, `finish_search`).

`BeamScheduling` is owned by the `Scheduler`, which calls it only where a beam search is
concerned: the plain path (one request at a time, or the steady decode path) pays nothing for
it. It holds the scheduler's `running` and `waiting` lists (the same objects, never copies) and
the KV manager, and calls back into the scheduler for what is the scheduler's policy: which
request to preempt (`Scheduler._preempt`) and how a sequence finishes (`Scheduler.finish`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pagedrt.core.beam import step_searches
from pagedrt.core.plan import BEAM_ARRAYS, StepResult
from pagedrt.core.request import Request, RequestStatus
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.outputs import TokenEvent


class BeamScheduling:
    """The bookkeeping of beam searches for a `Scheduler` (see the module docstring).

    Args:
        kv_manager: the scheduler's KV manager.
        running, waiting: the scheduler's queues (read; `admit` removes a search's slots from
            `waiting`).
        preempt: `Scheduler._preempt`: preempts a running request (a search: all its running
            slots) and returns how many running sequences left, from the end of `running`.
        finish: `Scheduler.finish`: removes a sequence from every queue and frees its blocks.
    """

    def __init__(self, kv_manager: KVCacheManager, running: list[Request],
                 waiting: list[Request], preempt: Callable[[Request], int],
                 finish: Callable[[Request, RequestStatus], None]) -> None:
        self.kv = kv_manager
        self.running = running
        self.waiting = waiting
        self._preempt = preempt
        self._finish = finish

    # ----------------------------------------------------------------- schedule
    def hold_completions(self, planned: list[int], remaining: list[int]) -> None:
        """The slots of a beam search complete their tokens in the same step (the device
        expands them together) or none does: unless every slot completes, a slot that would
        computes one token less (a decode: none) and waits for the others. (The slots of a
        search always run together: preempted and admitted as one.) planned, remaining:
        aligned with `running`; planned is changed in place."""
        running = self.running
        i = 0
        while i < len(running):
            beam = running[i].beam
            if beam is None or len(running[i].group) == 1:
                i += 1
                continue
            j = i + 1
            while j < len(running) and running[j].beam is beam:
                j += 1
            if planned[i:j] != remaining[i:j]:
                for k in range(i, j):
                    if planned[k] == remaining[k] > 0:
                        planned[k] -= 1
            i = j

    def admit(self, budget: int) -> list[tuple[Request, int]] | None:
        """Bring back a preempted beam search, every slot at once (its slots lead the waiting
        queue, in order): each gets its prefix-cache hits (the slots before it in this call
        computing blocks the next ones hit) and at least one token, but not its last (the
        slots complete together, in a later step), within `budget` tokens in all. If a slot
        does not fit, the ones allocated in this call are undone and nothing changes.

        Returns None, or (slot, new tokens) for every slot, in order: the slots have left
        `waiting`, their blocks are allocated and their hits counted as computed; the caller
        starts them (running, scheduled). Every slot leaves at least its last token for a
        later step, so the step is a chunked one."""
        head = self.waiting[0]
        slots = self.waiting[:len(head.group)]
        assert [s.sample_index for s in slots] == list(range(len(head.group))) and all(
            s.beam is head.beam for s in slots), f"{slots} are not the slots of {head}"
        if budget < len(slots):
            return None
        bs = self.kv.block_size
        admitted: list[tuple[Request, int, int]] = []  # (slot, hit tokens, new tokens)
        left = budget
        for k, slot in enumerate(slots):
            hits, num_hit_tokens = self.kv.get_computed_blocks(slot)
            num_left = slot.num_tokens - num_hit_tokens
            if num_left == 1:  # compute the last cached block again: leave the last token
                hits = hits[:-1]
                num_hit_tokens -= bs
                num_left += bs
            num_new = min(num_left - 1, left - (len(slots) - 1 - k))
            if self.kv.allocate_slots(slot, num_new, hits) is None:
                for done, num_hit, _ in reversed(admitted):
                    self.kv.unallocate(done, num_hit // bs)
                return None
            admitted.append((slot, num_hit_tokens, num_new))
            left -= num_new
        del self.waiting[:len(slots)]
        for slot, num_hit_tokens, _ in admitted:
            slot.num_computed_tokens = num_hit_tokens
        return [(slot, num_new) for slot, _, num_new in admitted]

    def allocate(self, i: int, planned: list[int], remaining: list[int],
                 scheduled: list[Request], num_new_tokens: list[int]) -> tuple[int, bool]:
        """Blocks for the slots of the beam search at running[i:] (together, slot order): the
        least important running requests are preempted until all fit, or the search itself
        is; only then is any slot allocated, and each slot with planned tokens appended to
        `scheduled` and `num_new_tokens`. planned, remaining: aligned with `running`, shortened
        by the preemptions.

        Returns (the index after the search's slots, or i itself if the search was preempted;
        whether some slot got fewer tokens than it has left, a chunked step)."""
        running = self.running
        beam = running[i].beam
        j = i + 1
        while j < len(running) and running[j].beam is beam:
            j += 1
        members = [k for k in range(i, j) if planned[k]]
        if all(planned[k] == 1 for k in members) and len(members) <= self.kv.num_free_blocks:
            need = 0  # decodes: at most one block each (a new block or a copy-on-write)
        else:
            need = self.kv.num_blocks_to_allocate([running[k] for k in members],
                                                  [planned[k] for k in members])
        while need > self.kv.num_free_blocks:
            head = running[i]
            num_preempted = self._preempt(running[-1])
            del planned[-num_preempted:], remaining[-num_preempted:]
            if head.status is not RequestStatus.RUNNING:  # the search itself went
                return i, False
        chunked = False
        for k in members:
            allocated = self.kv.allocate_slots(running[k], planned[k])
            assert allocated is not None, (
                f"{running[k]}: {planned[k]} tokens do not fit after making room for {need}")
            scheduled.append(running[k])
            num_new_tokens.append(planned[k])
            if planned[k] < remaining[k]:
                chunked = True
        return j, chunked

    # ----------------------------------------------------------------- update
    def update(self, beams: list[tuple[Request, int]], result: StepResult,
               events: list[TokenEvent] | None, touched: dict[str, Request],
               now: float) -> int:
        """The expansions of a step's beam searches (docs/design.md, "Beam search"): HF's
        bookkeeping (`step_searches`, numpy over the searches of one width), then either the
        search's end (its slots finish; its result is `beam.finished`, reported through
        `touched`, or as TokenEvents) or each slot's new beam: its parent's tokens and the
        candidate's token over the placeholder, and its block table re-parented by the KV
        manager, as the device side re-parented its rows. beams: (slot 0, the index of its
        placeholder) per search the step expanded. Returns the tokens written (W per
        search)."""
        planned = {head.request_id: (head, index) for head, index in beams}
        assert len(planned) == len(beams) == sum(len(b.req_ids) for b in result.beams), (
            f"expanded {[b.req_ids for b in result.beams]}, planned {sorted(planned)}")
        num_written = 0
        block_size = self.kv.block_size
        moves: list[tuple[str, str, int]] = []  # the moved slots' KV: one call for all
        for expansion in result.beams:
            searches = [planned.pop(req_id) for req_id in expansion.req_ids]
            live = [i for i, (head, _) in enumerate(searches) if not head.is_finished]
            if len(live) < len(searches):  # aborted
                searches = [searches[i] for i in live]
                expansion = dataclasses.replace(
                    expansion, req_ids=[expansion.req_ids[i] for i in live],
                    **{name: getattr(expansion, name)[live] for name in BEAM_ARRAYS})
            if not searches:
                continue
            width = expansion.slot_candidates.shape[1]
            new = step_searches([head.beam for head, _ in searches],
                                [index + 1 for _, index in searches], expansion.logprobs,
                                expansion.beams, expansion.tokens, expansion.slot_candidates)
            moved = (expansion.slot_parents != np.arange(width)).any(axis=1).tolist()
            parents, slot_tokens = expansion.slot_parents.tolist(), expansion.slot_tokens.tolist()
            num_written += len(searches) * width
            for g, (head, index) in enumerate(searches):
                slots = head.group
                if head.first_token_time is None:
                    head.first_token_time = now
                head.last_token_time = now
                if new and g in new:  # (only these can gain hypotheses, or be done)
                    outputs = [slot.output_token_ids for slot in slots]
                    beams_of = expansion.beams[g].tolist()
                    for c, hypothesis in new[g]:
                        hypothesis.token_ids = outputs[beams_of[c]][:index] + [
                            int(expansion.tokens[g, c])]
                    if head.beam.done:
                        self.finish_search(head, index, events)
                        touched[head.request_id] = head
                        continue
                tokens = slot_tokens[g]
                if not moved[g]:
                    for slot, token in zip(slots, tokens):
                        slot.output_token_ids[index] = token
                else:
                    slot_parents = parents[g]
                    outputs = [slot.output_token_ids for slot in slots]
                    for s, p in enumerate(slot_parents):
                        if p != s:  # (a moved slot is nobody's parent; a later placeholder,
                            outputs[s][:index] = outputs[p][:index]  # async, stays)
                        outputs[s][index] = tokens[s]
                    if slots[0].status is RequestStatus.RUNNING:  # (preempted: no KV)
                        num_blocks = (len(head.prompt_token_ids) + index) // block_size
                        moves += [(slots[s].request_id, slots[p].request_id, num_blocks)
                                  for s, p in enumerate(slot_parents) if p != s]
                for slot in slots:  # (placeholders a later plan appended stay pending)
                    slot.num_pending_tokens = len(slot.output_token_ids) - index - 1
        if moves:
            self.kv.reparent_slots(moves)
        return num_written

    def finish_search(self, head: Request, index: int,
                      events: list[TokenEvent] | None) -> None:
        """Finish every slot of a search that is done (their tokens from `index` on, only
        placeholders, dropped); in token-event mode, send each hypothesis (best first: sample
        index = rank) as one event per token."""
        for slot in head.group:
            del slot.output_token_ids[index:]
            slot.num_pending_tokens = 0
            if not slot.is_finished:
                self._finish(slot, RequestStatus.FINISHED_STOPPED)
        if events is None:
            return
        for rank, hypothesis in enumerate(head.beam.finished):
            last = len(hypothesis.token_ids) - 1
            for i, token in enumerate(hypothesis.token_ids):
                events.append(TokenEvent(head.request_id, rank, token, None,
                                         hypothesis.finish_reason if i == last else None, None))
