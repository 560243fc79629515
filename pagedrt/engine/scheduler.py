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
     `max_num_seqs` allow. A prompt longer than the remaining budget is chunked.

With async scheduling (see `LLMEngine.step`) a request's last token may be a placeholder for
one still being sampled on the device: it is scheduled like any other token, except when it is
the request's last allowed token (`max_tokens`), so nothing follows it.

Importance is (priority, arrival order): lower first. The scheduler never touches free lists;
it asks the KVCacheManager, which answers None on shortage.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from pagedrt.config import EngineConfig
from pagedrt.core.request import Request, RequestStatus
from pagedrt.kv.kv_cache_manager import KVCacheManager, PendingCopies

logger = logging.getLogger("pagedrt.scheduler")


@dataclass
class SchedulerOutput:
    """The plan for one step."""

    requests: list[Request] = field(default_factory=list)  # in batch order
    num_new_tokens: list[int] = field(default_factory=list)  # per request, >= 1
    copies: PendingCopies = field(default_factory=PendingCopies)
    preempted: list[Request] = field(default_factory=list)

    @property
    def total_num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.requests)


class Scheduler:
    def __init__(self, config: EngineConfig, kv_manager: KVCacheManager):
        self.config = config
        self.kv = kv_manager
        self.waiting: list[Request] = []  # sorted by sort_key
        self.running: list[Request] = []  # sorted by sort_key
        self.swapped: list[Request] = []  # sorted by sort_key
        self.num_preemptions: Counter = Counter()
        self.num_chunked_prefill_steps = 0
        self.peak_num_running = 0
        self.peak_num_used_blocks = 0

    # ----------------------------------------------------------------- queues
    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        _insert_sorted(self.waiting, request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Remove a request from every queue and free its blocks (finished or aborted)."""
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        request.status = status
        self.kv.free(request)

    # ----------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        max_tokens = self.config.max_num_batched_tokens
        self._chunked = False  # some request gets only part of its remaining tokens

        # 1. running requests. The token budget goes to decodes first (one token each), then to
        #    unfinished prefill chunks, most important first within each kind; blocks are then
        #    allocated most important first, preempting from the least important end.
        remaining, planned = self._plan_running(max_tokens)  # aligned with self.running
        allocate = self.kv.allocate_slots
        i = 0
        while i < len(self.running):
            num_new = planned[i]
            if num_new == 0:
                i += 1
                continue
            req = self.running[i]
            while allocate(req, num_new) is None:
                # the least important running request sits last; it is never one already
                # scheduled this step, since those come before index i
                victim = self.running[-1]
                self._preempt(victim, out)
                del planned[-1], remaining[-1]
                if victim is req:
                    break
            else:
                out.requests.append(req)
                out.num_new_tokens.append(num_new)
                if num_new < remaining[i]:
                    self._chunked = True
                i += 1
                continue
            # req itself was preempted; the list shifted, i already points to the next one
        budget = max_tokens - out.total_num_tokens

        # 2. swapped requests, then 3. waiting ones, only if nobody was preempted this step
        if not out.preempted:
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
                self._start(req, num_new, out)
                budget -= num_new
            while (self.waiting and not self.swapped and budget > 0
                   and len(self.running) < self.config.max_num_seqs):
                req = self.waiting[0]
                hits, num_hit_tokens = self.kv.get_computed_blocks(req)
                # the query length comes from the count after the cache hit
                num_new = min(req.num_tokens - req.num_computed_tokens - num_hit_tokens, budget)
                if self.kv.allocate_slots(req, num_new, hits) is None:
                    break
                self.waiting.pop(0)
                self._chunked |= req.num_computed_tokens + num_new < req.num_tokens
                if req.num_preemptions == 0:
                    req.num_cached_tokens = num_hit_tokens
                self._start(req, num_new, out)
                budget -= num_new

        # copies queued by preemptions of a step that runs nothing wait for the next forward
        if out.requests:
            out.copies = self.kv.take_pending_copies()
        if self._chunked:
            self.num_chunked_prefill_steps += 1
        self.peak_num_running = max(self.peak_num_running, len(self.running))
        used = self.kv.num_blocks - self.kv.num_free_blocks
        self.peak_num_used_blocks = max(self.peak_num_used_blocks, used)
        return out

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
            return remaining, list(remaining)
        planned = [0] * len(remaining)
        for i, num in enumerate(remaining):  # decodes
            if num == 1 and budget:
                planned[i] = 1
                budget -= 1
        for i, num in enumerate(remaining):  # prefill chunks
            if num > 1 and budget:
                planned[i] = min(num, budget)
                budget -= planned[i]
        return remaining, planned

    def _start(self, req: Request, num_new: int, out: SchedulerOutput) -> None:
        req.status = RequestStatus.RUNNING
        _insert_sorted(self.running, req)
        out.requests.append(req)
        out.num_new_tokens.append(num_new)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        req.num_preemptions += 1
        mode = self.config.preemption_mode
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
        out.preempted.append(req)
        logger.info(
            "preempted %s by %s: no free KV block (%d of %d blocks free, %d running)",
            req.request_id, mode, self.kv.num_free_blocks, self.kv.num_blocks, len(self.running),
        )


def _insert_sorted(queue: list[Request], req: Request) -> None:
    key = req.sort_key
    i = len(queue)
    while i > 0 and queue[i - 1].sort_key > key:
        i -= 1
    queue.insert(i, req)
