"""Scheduler: which requests run this step and how many new tokens each gets.

Every request follows one rule: `num_computed_tokens` catches up with `num_tokens`. A step
gives each scheduled request at least one new token, within `max_num_batched_tokens` in all:

  1. running requests first: the token budget goes to decodes (one token each), then to
     unfinished prefill chunks, most important first within each kind; blocks are allocated
     most important first, and when the KV cache is out of blocks the least important
     running request is preempted (recompute: drop its blocks, re-prefill later; swap: move
     its blocks to the CPU pool, falling back to recompute when that pool is full);
  2. then swapped-out requests, brought back when their blocks fit;
  3. then waiting requests, with their prefix-cache hits, as long as blocks and
     `max_num_seqs` allow. A prompt longer than the remaining budget is chunked. A request
     asking for prompt logprobs takes no prefix-cache hit (cached positions have no logits),
     and each of its prompt positions is planned for prompt logprobs once
     (`StepPlan.prompt_logprobs`), even when a preemption makes it compute them again.

With async scheduling (see `LLMEngine.step`) a request's last token may be a placeholder for
one still being sampled on the device: it is scheduled like any other token, except when it is
the request's last allowed token (`max_tokens`), so nothing follows it.

Speculative decoding (`EngineConfig.speculative_config`): while the engine holds at most
`disable_by_batch_size` unfinished sequences, a decoding sequence whose last token is known
and whose speculation is not paused (the per-sequence acceptance rule,
pagedrt/spec/acceptance.py) gets up to k draft tokens from the proposer
(pagedrt/spec/proposer.py), within the step's leftover token budget and never past
`max_tokens`; its query is 1 + the drafts, and `num_computed_tokens` advances by all of them.
Speculative tokens never preempt anyone: when their blocks do not fit, the sequence decodes
one token. `update` then writes the accepted tokens, rolls back the rejected ones and tells
the acceptance rule how many were accepted.

Multi-step decode (`EngineConfig.num_scheduler_steps` > 1; docs/design.md, "Multi-step
decode"): a steady decode plan with nothing waiting, whose sequences need no host work between
passes, runs up to that many passes (`StepPlan.num_steps`, never past a sequence's
max_tokens); each sequence gets that many slots and placeholders, and `update` writes and
stop-checks their tokens one by one.

Importance is (priority, arrival order): lower first. The scheduler never touches free lists;
it asks the KVCacheManager, which answers None on shortage.

Beam search (docs/design.md, "Beam search"): the W slots of a search move as one, in
scheduling, allocation, preemption, admission and update; that bookkeeping is
`BeamScheduling` (pagedrt/engine/beam_scheduling.py), which the scheduler calls only where a
beam search is concerned.

The scheduler is the one writer of a request's progress (docs/design.md, "Who writes what"):

    schedule()             status (admission, preemption); num_computed_tokens, advanced by
                           the planned tokens once the plan is made (the next plan, made before
                           this step's tokens are back under async scheduling, builds on it);
                           a placeholder output token per sampled sequence; forks (n > 1, and
                           a beam search's slots)
    update(plan, result)   the sampled ids over the placeholders (and the further tokens of
                           sequences that verified drafts), logprobs, token times, and
                           finishing (the caller's stop check decides, update writes); beam
                           searches (`BeamScheduling.update`): the expansion's bookkeeping
                           (BeamGroup.step), the slots' re-parenting (tokens, and block tables
                           through the KV manager) and their end; the rollback of rejected
                           drafts: num_computed_tokens lowered, the blocks past it freed
                           (`KVCacheManager.trim`)
    finish(), abort()      status and blocks of requests that end between steps

What it hands the device side is a `StepPlan` (pagedrt/core/plan.py): plain data.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from itertools import count, repeat
from typing import NamedTuple

import numpy as np

from pagedrt.config import EngineConfig
from pagedrt.core.plan import NewRequestData, StepPlan, StepResult
from pagedrt.core.request import PLACEHOLDER_TOKEN_ID, Request, RequestStatus
from pagedrt.engine.beam_scheduling import BeamScheduling
from pagedrt.engine.running_rows import RunningRows
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.outputs import PromptLogprobsEvent, TokenEvent
from pagedrt.spec.acceptance import AcceptanceRule
from pagedrt.spec.proposer import make_host_proposer

logger = logging.getLogger("pagedrt.scheduler")

StopCheck = Callable[[Request, int, int], "RequestStatus | None"]
"""(request, token, number of generated tokens with it) -> a finished status, or None."""


class SteadyDecode(NamedTuple):
    """The running part of a steady decode plan (`Scheduler._steady_decode`): every running
    sequence scheduled computes its one last token and samples the next; the others (async
    scheduling: their last allowed token is being sampled) are not scheduled.

    Attributes:
        rows: the running sequences (`RunningRows`).
        picked: [n] int64 the rows scheduled, in row order; None: every row.
        requests, req_ids: the scheduled sequences and their ids.
        outputs: their output_token_ids lists.
        num_output: [n] int64 their output lengths before the plan: where each one's
            placeholder goes.
        computed: [n] int64 their num_computed_tokens before the plan.
        num_finished: `Scheduler.num_finished` when the plan was made (`update` then knows
            whether any of them may have finished since).
    """

    rows: RunningRows
    picked: np.ndarray | None
    requests: list[Request]
    req_ids: list[str]
    outputs: list[list[int]]
    num_output: np.ndarray
    computed: np.ndarray
    num_finished: int

    def take(self, values):
        """The entries of a per-row array or list of `rows` for the scheduled rows."""
        if self.picked is None:
            return values
        if isinstance(values, np.ndarray):
            return values[self.picked]
        return [values[i] for i in self.picked.tolist()]


class Scheduler:
    def __init__(self, config: EngineConfig, kv_manager: KVCacheManager):
        self.config = config
        self.kv = kv_manager
        self.waiting: list[Request] = []  # sorted by sort_key
        self.running: list[Request] = []  # sorted by sort_key
        self.swapped: list[Request] = []  # sorted by sort_key
        self.num_preemptions: Counter = Counter()
        self.num_chunked_prefill_steps = 0
        # multi-step decode (EngineConfig.num_scheduler_steps): plans of more than one pass,
        # and their passes
        self.num_multi_step_plans = self.num_multi_step_passes = 0
        self.peak_num_running = 0
        self.peak_num_used_blocks = 0
        self._next_step_id = 0
        # plans whose results `update` has not written yet: step_id -> (the sampled sequences
        # in row order, the index of each one's placeholder in its output_token_ids, the
        # beam searches expanded: (slot 0, its placeholder's index), the plan's steady
        # running part or None)
        self._sampled: dict[int, tuple[list[Request], list[int],
                                       list[tuple[Request, int]], SteadyDecode | None]] = {}
        # plans with prompt logprobs whose results are not written yet: step_id -> the
        # sequences they asked them for, by id
        self._prompt_logprob_reqs: dict[int, dict[str, Request]] = {}
        # steady decode steps (docs/design.md, "Host work per step"): a snapshot of
        # `running`, rebuilt when that list changes; False turns the path off (tests compare)
        self.steady_decode = True
        self._rows: RunningRows | None = None
        self.num_finished = 0  # sequences finished so far (finish())
        # those finished since the oldest steady plan whose results are not written yet,
        # oldest first (`update` finds them among that plan's rows); num_finished counted
        # the ones before the first
        self._finished_log: list[Request] = []
        self._finished_base = 0
        # for the next plan: sequences finished since the last one that the device side may
        # hold a row or parked state for (a token in flight, a penalty slot), and sequences
        # preempted since (between steps too, as tests do)
        self._finished_req_ids: list[str] = []
        self._preempted_req_ids: list[str] = []
        # speculative decoding: the proposer (None: off), the per-sequence pauses, counters
        self.spec_config = spec = config.speculative
        self.proposer = make_host_proposer(spec) if spec is not None else None
        self.acceptance = (AcceptanceRule(spec.min_mean_accepted_length)
                           if spec is not None else None)
        self.num_spec_steps = 0  # steps that verified drafts
        self.num_spec_drafts = 0  # (sequence, step) pairs with drafts verified
        self.num_spec_draft_tokens = 0
        self.num_spec_accepted_tokens = 0
        self.num_spec_early_reads = 0  # async steps read before the next plan to speculate
        # beam searches: their slots scheduled, allocated, admitted and updated as one
        self.beam_scheduling = BeamScheduling(self.kv, self.running, self.waiting,
                                              self._preempt, self.finish)

    # ----------------------------------------------------------------- queues
    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        _insert_sorted(self.waiting, request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Remove a request from every queue and free its blocks (finished or aborted)."""
        if request.status is RequestStatus.RUNNING or request.num_preemptions:
            self._finished_req_ids.append(request.request_id)
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        request.status = status
        self.num_finished += 1
        self._finished_log.append(request)
        self.kv.free(request)
        if self.proposer is not None:
            self.proposer.drop(request.request_id)
            self.acceptance.drop(request.request_id)

    def ids_to_drop(self) -> set[str]:
        """Sequences whose device-side rows the next plan drops (finished or preempted since
        the last plan)."""
        return set(self._finished_req_ids) | set(self._preempted_req_ids)

    def abort(self, head: Request) -> None:
        """Abort every sample of a request; a token still being sampled is dropped with it."""
        for seq in head.group:
            if not seq.is_finished:
                self.finish(seq, RequestStatus.FINISHED_ABORTED)
            if seq.num_pending_tokens:
                del seq.output_token_ids[-seq.num_pending_tokens:]
                seq.num_pending_tokens = 0

    # ----------------------------------------------------------------- speculation
    def speculating(self) -> bool:
        """Whether the next plan may give drafts (the switch-off rule: at most
        `disable_by_batch_size` unfinished sequences; pagedrt/spec/config.py says why)."""
        return (self.proposer is not None
                and len(self.running) + len(self.waiting) + len(self.swapped)
                <= self.spec_config.disable_by_batch_size)

    def wants_known_tokens(self) -> bool:
        """Whether the engine should read the step in flight before the next plan (async
        scheduling) so that this plan can speculate: speculation is on and some decoding
        sequence not paused by the acceptance rule has known tokens that already end in a
        match (n-gram; always, for a draft model). Drafts follow a sequence's last token, so
        they need it on the host."""
        if not self.speculating():
            return False
        has_match = self.proposer.has_match
        may_speculate = self.acceptance.may_speculate
        step_id = self._next_step_id  # the plan about to be made
        if any(req.output_token_ids and may_speculate(req.request_id, step_id)
               and has_match(req) for req in self.running):
            self.num_spec_early_reads += 1
            return True
        return False

    # ----------------------------------------------------------------- schedule
    def schedule(self) -> StepPlan:
        """Plan one step (see the module docstring). Returns a StepPlan, empty (falsy) when
        nothing can run; it still carries the rows to drop."""
        plan = StepPlan(step_id=self._next_step_id)
        self._next_step_id += 1
        scheduled: list[Request] = []  # row order
        num_new_tokens = plan.num_new_tokens
        max_tokens = self.config.max_num_batched_tokens
        self._chunked = False  # some request gets only part of its remaining tokens

        # 1. running requests. The token budget goes to decodes first (one token each), then to
        #    unfinished prefill chunks, most important first within each kind; blocks are then
        #    allocated most important first, preempting from the least important end.
        num_preempted_before = len(self._preempted_req_ids)
        # speculative decoding: drafts from the budget the plan leaves, most important first
        # (none while a beam search is unfinished: its slots' joint block check assumes plain
        # decodes, and a step that forks a search's slots must not verify drafts)
        speculate = self.speculating() and not any(
            r.beam is not None or r.params.beam_search is not None
            for queue in (self.running, self.waiting, self.swapped) for r in queue)
        steady = None
        if self.steady_decode and not speculate:
            steady = self._steady_decode(max_tokens)
        if steady is not None:  # the same plan as the loop below would make, in numpy
            scheduled.extend(steady.requests)
            num_new_tokens.extend(repeat(1, len(scheduled)))
            if self.config.num_scheduler_steps > 1 and not self.waiting and not self.swapped:
                plan.num_steps = self._multi_step_length(steady)
        else:
            self._schedule_running(plan, max_tokens, speculate, scheduled)
        budget = max_tokens - sum(num_new_tokens)
        num_running_scheduled = len(scheduled)

        # 2. swapped requests, then 3. waiting ones, only if nobody was preempted this step
        if len(self._preempted_req_ids) == num_preempted_before:
            while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
                req = self.swapped[0]
                num_new = min(req.num_tokens - req.num_computed_tokens, budget)
                self._chunked |= num_new < req.num_tokens - req.num_computed_tokens
                if not self.kv.can_swap_in(req, num_new):
                    break
                self.swapped.pop(0)
                self.kv.swap_in(req)
                # allocated outside the assert: `python -O` strips asserts with their
                # side effects
                allocated = self.kv.allocate_slots(req, num_new)
                assert allocated is not None, (
                    f"{req}: {num_new} tokens do not fit after swap-in")
                self._start(req, num_new, scheduled, num_new_tokens)
                budget -= num_new
            while (self.waiting and not self.swapped and budget > 0
                   and len(self.running) < self.config.max_num_seqs):
                req = self.waiting[0]
                if req.beam is not None and len(req.group) > 1:  # a preempted beam search
                    admitted = self.beam_scheduling.admit(budget)
                    if admitted is None:
                        break
                    for slot, num_new in admitted:
                        self._start(slot, num_new, scheduled, num_new_tokens)
                        budget -= num_new
                    self._chunked = True  # every slot leaves at least its last token for later
                    continue
                # (prompt logprobs need every prompt position's logits: no hit)
                hits, num_hit_tokens = (([], 0) if req.wants_prompt_logprobs
                                        else self.kv.get_computed_blocks(req))
                # the query length comes from the count after the cache hit
                num_new = min(req.num_tokens - req.num_computed_tokens - num_hit_tokens, budget)
                if self.kv.allocate_slots(req, num_new, hits) is None:
                    break
                self.waiting.pop(0)
                req.num_computed_tokens += num_hit_tokens  # the hits count as computed
                self._chunked |= req.num_computed_tokens + num_new < req.num_tokens
                if req.num_preemptions == 0:
                    req.num_cached_tokens = num_hit_tokens
                self._start(req, num_new, scheduled, num_new_tokens)
                budget -= num_new

        if scheduled:
            # copies queued by preemptions of a step that runs nothing wait for the next forward
            plan.copies = self.kv.take_pending_copies()
            changes = plan.block_changes = self.kv.take_block_changes()
            for req in scheduled[num_running_scheduled:]:  # new to the device side: all of it
                changes.pop(req.request_id, None)
                beam = req.beam
                plan.new_requests.append(NewRequestData(
                    req.request_id, list(req.prompt_token_ids), req.output_token_ids[:],
                    req.params, req.sample_index, req.eos_token_ids,
                    self.kv.block_ids(req.request_id), req.num_computed_tokens,
                    None if beam is None else req.group[0].request_id,
                    0.0 if beam is None else float(beam.scores[req.sample_index])))
            self._advance(plan, scheduled, steady)
        plan.finished_req_ids, self._finished_req_ids = self._finished_req_ids, []
        plan.preempted_req_ids, self._preempted_req_ids = self._preempted_req_ids, []
        if self._chunked:
            self.num_chunked_prefill_steps += 1
        self.peak_num_running = max(self.peak_num_running, len(self.running))
        used = self.kv.num_blocks - self.kv.num_free_blocks
        self.peak_num_used_blocks = max(self.peak_num_used_blocks, used)
        return plan

    def _schedule_running(self, plan: StepPlan, max_tokens: int, speculate: bool,
                          scheduled: list[Request]) -> None:
        """Section 1 of `schedule`, one running request at a time: tokens (and drafts) per
        request, blocks most important first, preemptions from the least important end."""
        remaining, planned = self._plan_running(max_tokens)  # aligned with self.running
        num_new_tokens = plan.num_new_tokens
        allocate = self.kv.allocate_slots
        # decodes only, and a free block for each: no allocation can fail (a decode takes at
        # most one block, new or copied), so a beam search's slots need no joint check
        beams_fit = (len(self.running) <= self.kv.num_free_blocks
                     and (not planned or max(planned) <= 1))
        spec_budget = max_tokens - sum(planned) if speculate else 0
        i = 0
        while i < len(self.running):
            num_new = planned[i]
            if num_new == 0:
                i += 1
                continue
            req = self.running[i]
            if req.beam is not None and not beams_fit and len(req.group) > 1:
                i, chunked = self.beam_scheduling.allocate(i, planned, remaining, scheduled,
                                                           num_new_tokens)
                self._chunked |= chunked
                continue
            drafts = None
            if spec_budget > 0 and remaining[i] == 1 and not req.num_pending_tokens:
                drafts = self._propose(req, spec_budget, plan.step_id)
                num_new += len(drafts)
            while allocate(req, num_new) is None:
                if drafts:  # speculative tokens never preempt anyone: decode one token
                    drafts = None
                    num_new = planned[i]
                    continue
                # the least important running request sits last; it is never one already
                # scheduled this step, since those come before index i
                num_preempted = self._preempt(self.running[-1])
                del planned[-num_preempted:], remaining[-num_preempted:]
                if req.status is not RequestStatus.RUNNING:  # req itself went
                    break
            else:
                if drafts:
                    plan.draft_token_ids[req.request_id] = drafts
                    spec_budget -= len(drafts)
                scheduled.append(req)
                num_new_tokens.append(num_new)
                if num_new < remaining[i]:
                    self._chunked = True
                i += 1
                continue
            # req itself was preempted; the list shifted, i already points to the next one

    def _steady_decode(self, max_tokens: int) -> SteadyDecode | None:
        """Section 1 of `schedule` for a steady decode step, with per-row numpy: when every
        running sequence is forked (beam searches' slots included), each has exactly its last
        token to compute or (async scheduling) its last allowed token in flight, and the
        blocks they may need are free, the plan schedules each of the first kind for one
        token, which is what `_schedule_running` would plan, and
        `KVCacheManager.allocate_decode` allocates what that loop would, in one call (with
        every allocation certain to succeed, a search's slots need no joint check). Returns
        None, having changed nothing, when the step is not such a step."""
        running = self.running
        n = len(running)
        if not n or n > max_tokens:
            return None
        rows = self._rows
        if rows is None or not rows.matches(running):
            rows = self._rows = RunningRows(running)
        if not rows.decodable:
            return None
        outputs, num_output, computed = rows.gather_counts()
        requests, req_ids, num_prompt = rows.requests, rows.req_ids, rows.num_prompt_tokens
        picked = None
        at_max = num_output >= rows.max_tokens
        if at_max.any():  # (the loop's rule: a token in flight, and nothing to schedule)
            if not all(requests[i].num_pending_tokens for i in np.flatnonzero(at_max).tolist()):
                return None
            picked = np.flatnonzero(~at_max)
            if not len(picked):
                return None
            keep = picked.tolist()
            requests = [requests[i] for i in keep]
            req_ids = [req_ids[i] for i in keep]
            outputs = [outputs[i] for i in keep]
            num_output, computed = num_output[picked], computed[picked]
            num_prompt = num_prompt[picked]
        # (the loop's `remaining` is num_tokens - num_computed_tokens)
        if not (num_prompt + num_output - computed == 1).all():
            return None
        # (False: some allocation might fail and preempt; the loop decides those)
        if not self.kv.allocate_decode(requests, req_ids, computed + 1):
            return None
        return SteadyDecode(rows, picked, requests, req_ids, outputs, num_output, computed,
                            self.num_finished)

    def _multi_step_length(self, steady: SteadyDecode) -> int:
        """The passes of a multi-step decode plan (docs/design.md, "Multi-step decode") made of
        a steady decode whose one-token slots `_steady_decode` allocated: up to
        `num_scheduler_steps`, none past any sequence's max_tokens (so a request never
        exceeds it, nor max_model_len: `validate_prompt`), with the further slots allocated
        here; 1 (a plain step) when the batch has more than `multi_step_max_num_seqs`
        sequences, when some sequence cannot take part (`RunningRows.multi_step`) or when the
        blocks the further slots need are not free (they never preempt anyone)."""
        rows = steady.rows
        cap = self.config.multi_step_max_num_seqs
        if cap is not None and len(steady.requests) > cap:
            return 1
        if not steady.take(rows.multi_step).all():
            return 1
        k = min(self.config.num_scheduler_steps,
                int((steady.take(rows.max_tokens) - steady.num_output).min()))
        if k <= 1:
            return 1
        requests = steady.requests
        if self.kv.num_blocks_to_allocate(requests, [k] * len(requests)) > \
                self.kv.num_free_blocks:
            return 1
        allocate = self.kv.allocate_slots
        for req in requests:  # (num_computed_tokens is still the plan's start)
            # allocated outside the assert: `python -O` strips asserts with their side effects
            allocated = allocate(req, k)
            assert allocated is not None, f"{req}: {k} slots do not fit, the count said they do"
        self.num_multi_step_plans += 1
        self.num_multi_step_passes += k
        return k

    def _propose(self, req: Request, budget: int, step_id: int) -> list[int]:
        """Drafts for a decoding sequence whose last token is known: at most `budget`, none
        past max_tokens (the step yields up to 1 + drafts tokens), none while the acceptance
        rule pauses the sequence."""
        num_output = len(req.output_token_ids)
        max_num = min(budget, req.params.max_tokens - num_output - 1)
        if (not num_output or max_num <= 0
                or not self.acceptance.may_speculate(req.request_id, step_id)):
            return []
        return self.proposer.propose(req, max_num)

    def _advance(self, plan: StepPlan, scheduled: list[Request],
                 steady: SteadyDecode | None) -> None:
        """Count the plan's tokens as computed, give each sequence the step samples for a
        placeholder token, and fork the requests whose prompt the step completes (n > 1).
        The steady running part of a plan (`steady`: scheduled[:n], each a one-token step that
        samples, none to fork) takes a loop of three writes per request.

        Done when the plan is made, not when its tokens are back: with async scheduling the
        next plan is made while this step runs and builds on these counts. A rollback
        (speculative decoding) would lower num_computed_tokens again in `update`."""
        sampled: list[Request] = []
        indices: list[int] = []
        beams: list[tuple[Request, int]] = []
        num_decode = k = 0
        req_ids: list[str] = []
        starts: list[int] = []
        if steady is not None:  # each computes its last token and samples: a decode if it has
            k = len(steady.requests)  # generated before (else that token ends a prompt)
            req_ids += steady.req_ids
            starts += steady.computed.tolist()
            num_steps = plan.num_steps  # (multi-step: that many tokens computed and sampled)
            placeholders = [PLACEHOLDER_TOKEN_ID] * num_steps
            for req, output_token_ids, end in zip(steady.requests, steady.outputs,
                                                  (steady.computed + num_steps).tolist()):
                req.num_computed_tokens = end
                output_token_ids += placeholders
                req.num_pending_tokens += num_steps  # (async: the step in flight's too)
            sampled += steady.requests
            indices += steady.num_output.tolist()
            num_decode = int(np.count_nonzero(steady.num_output))
            heads = steady.rows.beam_heads
            if len(heads):  # the searches' first slots, as the loop below hands them on
                if steady.picked is not None:
                    heads = np.flatnonzero(np.isin(steady.picked, heads))
                requests, num_output = steady.requests, steady.num_output
                beams += [(requests[i], int(num_output[i])) for i in heads.tolist()]
        rest = scheduled[k:]
        req_ids += [req.request_id for req in rest]
        starts += [req.num_computed_tokens for req in rest]
        plan.req_ids, plan.num_computed_tokens = req_ids, starts
        drafts = plan.draft_token_ids
        for req, num_new, start in zip(rest, plan.num_new_tokens[k:], starts[k:]):
            output_token_ids = req.output_token_ids
            end = req.num_computed_tokens = start + num_new
            if req.prompt_logprobs is not None and req.wants_prompt_logprobs:
                self._plan_prompt_logprobs(plan, req, start, end)
            # (num_tokens spelled out: this runs for every request of every step)
            if end != len(req.prompt_token_ids) + len(output_token_ids):
                if not drafts or req.request_id not in drafts:
                    continue  # a prefill chunk: nothing sampled
                num_decode += num_new  # the last token and its drafts
            elif num_new == 1 and output_token_ids:
                num_decode += 1
            sampled.append(req)
            indices.append(len(output_token_ids))
            if req.beam is not None and req.sample_index == 0:
                beams.append((req, len(output_token_ids)))
            output_token_ids.append(PLACEHOLDER_TOKEN_ID)
            req.num_pending_tokens += 1
            if not req.forked:
                self._fork(req, plan, sampled, indices)
        plan.num_prompt_tokens = sum(plan.num_new_tokens) - num_decode
        self._sampled[plan.step_id] = (sampled, indices, beams, steady)

    def _plan_prompt_logprobs(self, plan: StepPlan, req: Request, start: int,
                              end: int) -> None:
        """Ask the step computing positions [start, end) of `req` for the prompt logprobs of
        those positions no earlier plan asked for (prompt positions 0 .. P - 2 give the
        entries of prompt tokens 1 .. P - 1)."""
        first = req.num_prompt_logprobs_planned
        last = min(end, len(req.prompt_token_ids) - 1)
        assert start <= first, (
            f"{req}: prompt logprobs planned up to position {first}, but the chunk starts at "
            f"{start}")
        if last > first:
            plan.prompt_logprobs[req.request_id] = (first, last)
            req.num_prompt_logprobs_planned = last
            self._prompt_logprob_reqs.setdefault(plan.step_id, {})[req.request_id] = req

    def _fork(self, req: Request, plan: StepPlan, sampled: list[Request],
              indices: list[int]) -> None:
        """Fork a request whose prompt is complete into its n samples: every child shares all
        its blocks (copy-on-write later), has its computed count, and samples its own first
        token from the parent's logits row (its row follows the parent's). A beam search
        forks into its W slots the same way; its first expansion draws every candidate from
        the parent (the children have no beam yet)."""
        req.forked = True
        child_ids = plan.forks[req.request_id] = []
        position = self.running.index(req)
        for k in range(1, req.params.n):
            child = Request(f"{req.request_id}#{k}", req.prompt_token_ids, req.params,
                            req.prompt, req.priority, req.eos_token_ids, req.arrival_time)
            child.forked = True
            child.stream = req.stream
            child.arrival_seq = req.arrival_seq
            child.sample_index = k
            child.group = req.group
            child.beam = req.beam
            req.group.append(child)
            self.kv.fork(req, child)
            child.num_computed_tokens = req.num_computed_tokens
            child.num_prompt_logprobs_planned = req.num_prompt_logprobs_planned  # (all of them)
            child.status = RequestStatus.RUNNING
            self.running.insert(position + k, child)
            child_ids.append(child.request_id)
            sampled.append(child)
            indices.append(0)
            child.output_token_ids.append(PLACEHOLDER_TOKEN_ID)
            child.num_pending_tokens = 1

    def _plan_running(self, budget: int) -> tuple[list[int], list[int]]:
        """Tokens left to compute and new tokens this step per running request (aligned with
        self.running): decodes first, then prefill chunks, most important first within each
        kind."""
        remaining = [len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens
                     for r in self.running]
        for i, req in enumerate(self.running):
            if req.num_pending_tokens and len(req.output_token_ids) >= req.params.max_tokens:
                remaining[i] = 0  # its last token is being sampled now (async scheduling)
            else:
                assert remaining[i] >= 1, f"{req} is running with nothing to compute"
        num_decodes = remaining.count(1)
        if num_decodes == len(remaining) and budget >= num_decodes:  # the common decode step
            return remaining, list(remaining)  # (beam searches complete together here)
        planned = [0] * len(remaining)
        for i, num in enumerate(remaining):  # decodes
            if num == 1 and budget:
                planned[i] = 1
                budget -= 1
        for i, num in enumerate(remaining):  # prefill chunks
            if num > 1 and budget:
                planned[i] = min(num, budget)
                budget -= planned[i]
        self.beam_scheduling.hold_completions(planned, remaining)
        return remaining, planned

    def _start(self, req: Request, num_new: int, scheduled: list[Request],
               num_new_tokens: list[int]) -> None:
        req.status = RequestStatus.RUNNING
        _insert_sorted(self.running, req)
        scheduled.append(req)
        num_new_tokens.append(num_new)

    def _preempt(self, req: Request) -> int:
        """Preempt a running request (with a beam search: every running slot of it, by
        recompute; pagedrt/engine/beam_scheduling.py says why). Returns how many running
        sequences left, all from the end of self.running when `req` is its last."""
        beam = req.beam
        if beam is None or len(req.group) == 1:
            self._preempt_one(req, self.config.preemption_mode)
            return 1
        slots = [s for s in req.group if s.status is RequestStatus.RUNNING]
        for slot in reversed(slots):  # least important first, as one by one would go
            self._preempt_one(slot, "recompute")
        return len(slots)

    def _preempt_one(self, req: Request, mode: str) -> None:
        free_before = self.kv.num_free_blocks
        self.running.remove(req)
        req.num_preemptions += 1
        if mode == "swap" and self.kv.swap_out(req):
            req.status = RequestStatus.SWAPPED
            _insert_sorted(self.swapped, req)
        else:
            if mode == "swap":
                mode = "recompute (swap pool full)"
            self.kv.free(req)
            req.num_computed_tokens = 0
            req.status = RequestStatus.WAITING
            _insert_sorted(self.waiting, req)
        self.num_preemptions[mode.split()[0]] += 1
        self._preempted_req_ids.append(req.request_id)
        logger.info(
            "preempted request %r by %s: no free KV block for the running requests' next "
            "tokens; its %d blocks freed (now %d of %d free, %d still running)",
            req.request_id, mode, self.kv.num_free_blocks - free_before,
            self.kv.num_free_blocks, self.kv.num_blocks, len(self.running),
        )

    # ----------------------------------------------------------------- update
    def update(self, plan: StepPlan, result: StepResult, check_stop: StopCheck,
               events: list[TokenEvent] | None = None,
               prompt_events: list[PromptLogprobsEvent] | None = None,
               ) -> tuple[list[Request], int]:
        """Write a step's sampled tokens over their placeholders, then finish the sequences
        that `check_stop` stops (called only where a token can stop one: a stop or EOS token,
        the last allowed token, or a request whose text is checked for stop strings).

        Returns (the first samples of the requests to report: streamed ones that advanced and
        those whose every sample is now finished; the number of tokens written). Rows of
        sequences finished since the plan was made (aborted, or stopped by the token before)
        are dropped.

        events: when given (the engine core's token-event mode), a TokenEvent per written
        token is appended to it, and only the requests whose every sample finished are
        returned.

        Prompt logprobs (`result.prompt_logprobs`) are appended to their sequences'
        `prompt_logprobs` first, so that an output made with the first token holds them all;
        in token-event mode they also go to `prompt_events`, a PromptLogprobsEvent per sequence.
        """
        sampled, indices, beams, steady = self._sampled.pop(plan.step_id)
        prompt_reqs = self._prompt_logprob_reqs.pop(plan.step_id, None)
        if prompt_reqs is not None:
            _write_prompt_logprobs(prompt_reqs, result.prompt_logprobs, prompt_events)
        # keep the finished sequences that this plan or a later one not written yet may hold
        stamps = [e[3].num_finished for e in self._sampled.values() if e[3] is not None]
        if steady is not None:
            stamps.append(steady.num_finished)
        keep = min(stamps, default=self.num_finished)
        del self._finished_log[:keep - self._finished_base]
        self._finished_base = keep
        token_ids = result.sampled_token_ids
        assert len(token_ids) == len(sampled), (
            f"step {plan.step_id}: {len(token_ids)} sampled tokens for {len(sampled)} rows")
        if plan.draft_token_ids:
            return self._update_speculative(plan, result, sampled, indices, beams, check_stop,
                                            events)
        if plan.num_steps > 1:
            return self._update_multi_step(plan, result, sampled, indices, check_stop, events)
        logprobs = result.logprobs
        now = time.monotonic()
        touched: dict[str, Request] = {}
        num_generated = 0
        if beams:
            num_generated = self.beam_scheduling.update(beams, result, events, touched, now)
        rows = enumerate(zip(sampled, indices, token_ids))
        if steady is not None:
            num_written, one_by_one = self._write_quiet(steady, token_ids, now, events)
            num_generated += num_written
            rows = ((i, (sampled[i], indices[i], token_ids[i])) for i in one_by_one)
        for i, (req, index, token) in rows:
            if req.is_finished or req.beam is not None:
                # aborted, or stopped by the token before this one: drop the row; a beam slot
                # was written by BeamScheduling.update
                continue
            # (the one-token form of `_take_token` and `_note_report`, written out: this loop
            # runs for every row of a step that `_write_quiet` leaves, each step)
            output_token_ids = req.output_token_ids
            output_token_ids[index] = token
            req.num_pending_tokens = len(output_token_ids) - index - 1  # (a later plan's)
            if logprobs is not None and logprobs[i] is not None:
                req.append_logprob(logprobs[i])
            if req.first_token_time is None:
                req.first_token_time = now
            req.last_token_time = now
            num_generated += 1
            status = None
            # the full check only where it can stop the request or must see the text (a
            # request never reaches max_model_len before max_tokens: validate_prompt)
            if (token in req.stop_token_set or index + 1 >= req.params.max_tokens
                    or (req.detokenizer is not None and (req.stream or req.params.stop))):
                status = check_stop(req, token, index + 1)
            if status is not None:
                # a later step may have appended a placeholder already: it is not a token
                del output_token_ids[index + 1:]
                req.num_pending_tokens = 0
                self.finish(req, status)
            head = req.group[0]
            if events is not None:
                events.append(TokenEvent(
                    head.request_id, req.sample_index, token,
                    None if logprobs is None else logprobs[i],
                    None if status is None else status._value_,
                    None if status is None else req.stop_reason))
                if status is not None and all(s.is_finished for s in head.group):
                    touched[head.request_id] = head
            elif head.stream or (status is not None and all(s.is_finished for s in head.group)):
                touched[head.request_id] = head
        return list(touched.values()), num_generated

    def _write_quiet(self, steady: SteadyDecode, token_ids: list[int], now: float,
                     events: list[TokenEvent] | None) -> tuple[int, list[int]]:
        """`update` for the running part of a steady plan, for the sequences that need nothing
        else, in one loop of plain writes: each token over its placeholder, no token pending
        where that placeholder was the last one (no later plan appended another), the token
        time. Left to `update`'s loop (returned, with the plan's later rows, in row order):
        the sequences that are not quiet (`RunningRows.quiet`), except beam slots (written by
        `BeamScheduling.update`), those whose token may stop them (some running sequence's
        stop id, or their max_tokens), those getting their first token (its time), the
        sequences finished since the plan, and outside token-event mode the streamed ones
        (reported every step).
        In token-event mode each written token's TokenEvent is appended, and when any row is
        left every row is (the events stay in row order). Returns (tokens written, indices of
        the rows left)."""
        rows = steady.rows
        k = len(steady.requests)
        index = steady.num_output
        left = (~steady.take(rows.quiet) | (index == 0)
                | (index + 1 >= steady.take(rows.max_tokens)))
        if events is None:
            left |= steady.take(rows.streamed)
        stop_ids = rows.stop_token_ids
        if len(stop_ids):
            tokens = np.array(token_ids[:k], dtype=np.int64)
            left |= (tokens[:, None] == stop_ids).any(axis=1)
        requests = steady.requests
        for req in self._finished_log[steady.num_finished - self._finished_base:]:
            if req in requests:  # (C-level identity scans; a few finish per step)
                left[requests.index(req)] = True
        if events is not None and left.any():
            return 0, list(range(len(token_ids)))
        # (beam slots are left unwritten, and not to the loop either: `BeamScheduling.update`
        # wrote them; in token-event mode they are never quiet, so every row went to the loop)
        one_by_one = np.flatnonzero(left & ~steady.take(rows.is_beam)).tolist()
        for req, output_token_ids, i, token, skip in zip(
                requests, steady.outputs, index.tolist(), token_ids, left.tolist()):
            if skip:
                continue
            output_token_ids[i] = token
            req.num_pending_tokens = len(output_token_ids) - i - 1  # (a later plan's)
            req.last_token_time = now
        if events is not None:  # (every row is quiet here)
            head_ids, sample_indices = map(steady.take, rows.event_keys())
            events += map(TokenEvent, head_ids, sample_indices, token_ids, repeat(None, k),
                          repeat(None), repeat(None))
        return k - len(one_by_one), one_by_one + list(range(k, len(token_ids)))

    def _update_multi_step(self, plan: StepPlan, result: StepResult, sampled: list[Request],
                           indices: list[int], check_stop: StopCheck,
                           events: list[TokenEvent] | None) -> tuple[list[Request], int]:
        """`update` for a multi-step decode plan (`plan.num_steps` > 1; docs/design.md,
        "Multi-step decode"): each sequence's tokens, one per pass, over its placeholders,
        each written, stop-checked and reported in turn (stop strings, stop ids and
        max_tokens hold at the exact token), with its logprobs where asked (each pass's,
        `StepResult.multi_step_logprobs`); a sequence that stops drops the tokens after the
        stop (their KV sits in its blocks, freed with them). No sequence of such a plan is a
        beam slot (`RunningRows.multi_step`)."""
        passes = [result.sampled_token_ids, *result.multi_step_token_ids]
        pass_logprobs = ([result.logprobs, *result.multi_step_logprobs]
                         if result.multi_step_logprobs else [None] * len(passes))
        assert len(passes) == plan.num_steps, (
            f"step {plan.step_id}: {len(passes)} passes of tokens, planned {plan.num_steps}")
        now = time.monotonic()
        touched: dict[str, Request] = {}
        num_generated = 0
        for i, (req, index) in enumerate(zip(sampled, indices)):
            if req.is_finished:
                continue  # aborted, or stopped by a token before these: drop the row
            output_token_ids = req.output_token_ids
            head = req.group[0]
            status = None
            for position, tokens, logprobs in zip(count(index), passes, pass_logprobs):
                output_token_ids[position] = tokens[i]
                num_generated += 1
                status = self._take_token(req, head, tokens[i],
                                          None if logprobs is None else logprobs[i], position,
                                          now, check_stop, events, cache_first=True)
                if status is not None:
                    break
            else:  # (placeholders a later plan appended stay pending)
                req.num_pending_tokens = len(output_token_ids) - index - len(passes)
                # blocks the passes filled: no later allocation may come to hash them (none to
                # offer where a plan since preempted the sequence: freed, or swapped out)
                if req.status is RequestStatus.RUNNING:
                    self.kv.cache_computed_blocks(req)
            _note_report(touched, head, status, events)
        return list(touched.values()), num_generated

    def _take_token(self, req: Request, head: Request, token: int, logprob, position: int,
                    now: float, check_stop: StopCheck, events: list[TokenEvent] | None,
                    cache_first: bool = False) -> RequestStatus | None:
        """The rest of writing one of several tokens a step gives a sequence (a multi-step
        decode's, or a verification step's), once `token` is at `position` of its output: its
        logprobs (`logprob`, or None), token times, the stop check (where the token can stop
        it), its TokenEvent in token-event mode, and on a stop the tokens after it dropped and
        the sequence finished. Returns the stop's status, or None.

        cache_first (a multi-step decode): on a stop, offer the sequence's blocks full of
        computed, known tokens to the prefix cache before they are freed (every known token
        but the stop's has its KV, and the stop's is counted only where a later pass, or the
        step in flight, computes it: `KVCacheManager.cache_computed_blocks`). Not after a
        verification step: a rejected draft's KV sits where the target's own token goes."""
        if logprob is not None:
            req.append_logprob(logprob)
        if req.first_token_time is None:
            req.first_token_time = now
        req.last_token_time = now
        status = None
        if (token in req.stop_token_set or position + 1 >= req.params.max_tokens
                or (req.detokenizer is not None and (req.stream or req.params.stop))):
            status = check_stop(req, token, position + 1)
        if events is not None:
            events.append(TokenEvent(
                head.request_id, req.sample_index, token, logprob,
                None if status is None else status._value_,
                None if status is None else req.stop_reason))
        if status is not None:
            del req.output_token_ids[position + 1:]
            req.num_pending_tokens = 0
            if cache_first and req.status is RequestStatus.RUNNING:  # (not preempted since)
                self.kv.cache_computed_blocks(req)
            self.finish(req, status)
        return status

    def _update_speculative(self, plan: StepPlan, result: StepResult, sampled: list[Request],
                            indices: list[int], beams, check_stop: StopCheck,
                            events: list[TokenEvent] | None) -> tuple[list[Request], int]:
        """`update` for a step that verified drafts: a sequence may get several tokens, each
        written, stop-checked and reported in turn (so stop strings, stop ids, max_tokens and
        logprobs hold at the exact token), and its rejected drafts are rolled back:

            before the step:  computed = start          tokens: ... x
            the step:         computed = start + 1 + j   query:  x d1 .. dj  (j drafts)
            a accepted:       computed = start + 1 + a   tokens: ... x d1 .. da t
                              (t: the target's own token; the KV of d(a+1) .. dj is dropped,
                              blocks holding only such slots are freed)

        A sequence that stops at one of its tokens drops the tokens after it."""
        token_ids = result.sampled_token_ids
        logprobs = result.logprobs
        all_drafts = plan.draft_token_ids
        extras, extra_logprobs = result.extra_token_ids, result.extra_logprobs
        self.num_spec_steps += 1
        now = time.monotonic()
        touched: dict[str, Request] = {}
        num_generated = 0
        if beams:  # (a search whose prompt this step completed; its slots never speculate)
            num_generated = self.beam_scheduling.update(beams, result, events, touched, now)
        for i, (req, index, token) in enumerate(zip(sampled, indices, token_ids)):
            if req.is_finished or req.beam is not None:
                continue  # aborted, or stopped by the token before this one: drop the row
            rid = req.request_id
            drafts = all_drafts.get(rid)
            tokens = [token]
            lps = [None if logprobs is None else logprobs[i]]
            if drafts is not None:
                extra = extras.get(rid, [])
                tokens += extra
                lps += extra_logprobs.get(rid) or [None] * len(extra)
                self.num_spec_drafts += 1
                self.num_spec_draft_tokens += len(drafts)
                self.num_spec_accepted_tokens += len(extra)
                self.acceptance.record(rid, len(tokens), plan.step_id)
            output_token_ids = req.output_token_ids
            head = req.group[0]
            status = None
            for m, (tok, lp) in enumerate(zip(tokens, lps)):
                position = index + m
                if m == 0:
                    output_token_ids[position] = tok
                    req.num_pending_tokens = len(output_token_ids) - position - 1
                else:
                    output_token_ids.insert(position, tok)
                num_generated += 1
                status = self._take_token(req, head, tok, lp, position, now, check_stop, events)
                if status is not None:
                    break
            if status is None and drafts is not None:
                # rollback: the rejected drafts' KV is not the sequence's
                req.num_computed_tokens -= len(drafts) - (len(tokens) - 1)
                self.kv.trim(req)
                self.kv.cache_computed_blocks(req)
            _note_report(touched, head, status, events)
        return list(touched.values()), num_generated


def _note_report(touched: dict[str, Request], head: Request, status: RequestStatus | None,
                 events: list[TokenEvent] | None) -> None:
    """Put a request in the step's reported ones (`touched`) when its sample's tokens just
    finished every sample of it, or, outside token-event mode (`events` None), when it is
    streamed."""
    if ((status is not None and all(s.is_finished for s in head.group))
            or (events is None and head.stream)):
        touched[head.request_id] = head


def _write_prompt_logprobs(requests: dict[str, Request], entries: dict[str, list],
                           events: list[PromptLogprobsEvent] | None) -> None:
    """Append a step's prompt logprobs to their sequences (skipping those finished since:
    aborted), and their events where given."""
    for req_id, req in requests.items():
        got = entries.get(req_id)
        assert got is not None, f"{req}: the step returned no prompt logprobs"
        if req.is_finished:
            continue
        req.prompt_logprobs.extend(got)
        if events is not None:
            events.append(PromptLogprobsEvent(req.group[0].request_id, got))


def _insert_sorted(queue: list[Request], req: Request) -> None:
    key = req.sort_key
    i = len(queue)
    while i > 0 and queue[i - 1].sort_key > key:
        i -= 1
    queue.insert(i, req)
