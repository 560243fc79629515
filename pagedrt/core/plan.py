"""The step plan and the step result: everything that crosses between the host-side core
(scheduler, KV manager, requests) and the device side (model runner, sampler, KV cache) in one
step. Both are plain data that pickles (ints, strings, lists, numpy arrays, `SamplingParams`),
never a live `Request`, so a step can be sent to another process. docs/design.md has the whole
picture.

    host (Scheduler.schedule)  --StepPlan-->  device (ModelRunner.execute)
    host (Scheduler.update)    <--StepResult-- device (ModelRunner.fetch)

The device side keeps a persistent row per request (`pagedrt/engine/input_batch.py`): a plan
names the requests it sees for the first time (`new_requests`), and for the others only what
changed (new token counts, block-id changes, block copies). A request's row is dropped when the
plan lists it in `finished_req_ids` or `preempted_req_ids`.

Tokens: the device side appends to a row the tokens it sampled itself, so a plan carries token
ids only for requests new to the device side. A row whose last token was sampled by the
previous step and is not on the host yet (async scheduling) takes it from that step's sampled
ids on the device; the plan needs to say nothing about it.

Beam search (docs/design.md, "Beam search"): the device side also chooses, for every beam slot
it samples, which candidate the slot continues, and applies that choice to its own rows (the
slot's history and the shared prefix of its block table become its parent's; the slot's private
partial last block gets the parent's contents). This is a pure function of the step's
candidates, which `StepResult.beams` returns: the host replays it on the requests and the KV
manager's tables, so that the next plan again describes rows both sides agree on. A plan names
no re-parenting, as it names no sampled token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pagedrt.kv.kv_cache_manager import PendingCopies
from pagedrt.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request without a device-side row: admitted now, or resumed after a preemption.

    Attributes:
        req_id: the sequence's id (a forked sample's is "<request id>#<sample index>").
        prompt_token_ids: the prompt.
        output_token_ids: tokens generated so far (resumed requests), every one known.
        sampling_params: the request's settings.
        sample_index: which of the `n` samples this is; a seeded request's draws are keyed
            by (seed, sample_index) (`pagedrt.engine.sampling_state.seed_key`).
        eos_token_ids: the model's EOS ids (min_tokens suppresses them).
        block_ids: the request's whole block table.
        num_computed_tokens: tokens already in the KV cache before this step (prefix-cache
            hits, or the computed tokens of a swapped request).
        beam_group: for a beam slot, the request id of its search (its slot 0); else None.
        beam_score: a beam slot's cumulative log-probability (0.0 before the first expansion).
    """

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    sample_index: int
    eos_token_ids: tuple[int, ...]
    block_ids: list[int]
    num_computed_tokens: int
    beam_group: str | None = None
    beam_score: float = 0.0


BEAM_ARRAYS = ("logprobs", "beams", "tokens", "slot_candidates", "slot_parents", "slot_tokens")


@dataclass(eq=False)
class BeamStepResult:
    """The expansions of a step's beam searches of one width W and candidate count K, row i
    for search i (plain data: numpy arrays; equal when every field is).

    Attributes:
        req_ids: [G] each search's request id (its slot 0).
        logprobs: [G, K] float32 cumulative log-probabilities of the candidates, best first.
        beams: [G, K] int64 the slot of each candidate's parent beam.
        tokens: [G, K] int64 each candidate's token.
        slot_candidates: [G, W] int64 per slot, the index of the candidate its beam now is.
        slot_parents, slot_tokens: [G, W] int64 per slot, that candidate's parent slot and
            token (beams and tokens at slot_candidates).
    """

    req_ids: list[str]
    logprobs: np.ndarray
    beams: np.ndarray
    tokens: np.ndarray
    slot_candidates: np.ndarray
    slot_parents: np.ndarray
    slot_tokens: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BeamStepResult):
            return NotImplemented
        return self.req_ids == other.req_ids and all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in BEAM_ARRAYS)


@dataclass
class StepPlan:
    """What one step computes, in row order (`Scheduler.schedule` makes it).

    Attributes:
        step_id: increases by one per plan.
        req_ids: the scheduled sequences, in row order (running ones, then resumed and new).
        num_new_tokens: tokens each computes this step (query length, >= 1).
        num_computed_tokens: tokens each has in the KV cache before this step (the position of
            its first new token).
        new_requests: the scheduled sequences the device side has no row for.
        block_changes: req_id -> (start, block_ids): from index `start` on, the request's block
            table is `block_ids` (appended blocks; a copy-on-write or swap replaces entries).
            Only requests whose table changed other than by the new requests' full tables.
        copies: block copies to make before the forward (swap-outs, copy-on-write, swap-ins).
        forks: parent req_id -> ids of the samples it forks into once this step completes its
            prompt (n > 1); each child samples its own first token from the parent's logits
            row, and its rows follow the parent's in the sampled order.
        finished_req_ids: sequences finished or aborted since the last plan that have a row.
        preempted_req_ids: sequences preempted by this plan (their rows are dropped first).
        num_prompt_tokens: tokens of the step that are not decodes of the last sampled token
            (counters).
        draft_token_ids: speculative decoding: req_id -> the draft tokens the step verifies
            after the sequence's last token (its num_new_tokens is 1 + their number); -1
            entries are proposed on the device side (draft model) in this step. Empty: no
            sequence speculates.
        prompt_logprobs: req_id -> (a, b): positions a .. b - 1 of the sequence's chunk this
            step whose next-token log-probabilities are prompt logprobs to return (those of
            prompt tokens a + 1 .. b; pagedrt/engine/prompt_logprobs.py). Only sequences
            asking for them (`SamplingParams.prompt_logprobs`) with positions not yet sent
            (a prompt recomputed after a preemption sends none twice). Empty: none.
        num_steps: multi-step decode (docs/design.md, "Multi-step decode"): > 1 when every
            scheduled sequence computes one token and the device side then runs this many
            forward passes, each pass's sampled tokens the next one's inputs; the sequences'
            blocks hold slots for them all, and each gets num_steps sampled tokens. 1:
            one pass.
    """

    step_id: int = 0
    req_ids: list[str] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    new_requests: list[NewRequestData] = field(default_factory=list)
    block_changes: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    copies: PendingCopies = field(default_factory=PendingCopies)
    forks: dict[str, list[str]] = field(default_factory=dict)
    finished_req_ids: list[str] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    num_prompt_tokens: int = 0
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, int]] = field(default_factory=dict)
    num_steps: int = 1

    @property
    def total_num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        """True when the step runs the model (some request is scheduled)."""
        return bool(self.req_ids)


@dataclass
class StepResult:
    """What the device side returns for a step (`ModelRunner.fetch`).

    Attributes:
        req_ids: the sampled sequences in row order: every scheduled request whose step
            completed its known tokens, each parent of `forks` followed by its children.
        sampled_token_ids: one token id per entry of `req_ids` (a beam slot's: the token of
            the candidate it continues; a sequence that verified drafts: its first new token).
        logprobs: one `TokenLogprobs` (or None, for a row that did not ask) per entry; None
            when no row asked.
        beams: the beam searches expanded this step, one entry per (W, K) among them.
        extra_token_ids: speculative decoding: for every sequence of the plan's
            `draft_token_ids`, its new tokens after the first: the accepted drafts but the
            first, then the target model's own token (so 1 + len(...) tokens in all, and
            len(...) drafts accepted); empty when the plan verified no drafts.
        extra_logprobs: the TokenLogprobs of those tokens, per sequence that asked.
        prompt_logprobs: for every sequence of the plan's `prompt_logprobs`, one
            TokenLogprobs per position it names, in order (token_id: the prompt token at
            position + 1, its logprob and rank, top_logprobs: the request's
            `prompt_logprobs` most likely (token_id, logprob) there); empty when none.
        multi_step_token_ids: for a plan with num_steps > 1, the tokens of its passes after
            the first: num_steps - 1 lists, one per pass in order, each one token per entry
            of `req_ids`; empty otherwise.
        multi_step_logprobs: the logprobs of those passes' tokens, one entry per pass in
            order, each as `logprobs` is for the first pass (None when no row asked); empty
            for one pass.
    """

    req_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None
    beams: list[BeamStepResult] = field(default_factory=list)
    extra_token_ids: dict[str, list[int]] = field(default_factory=dict)
    extra_logprobs: dict[str, list] = field(default_factory=dict)
    prompt_logprobs: dict[str, list] = field(default_factory=dict)
    multi_step_token_ids: list[list[int]] = field(default_factory=list)
    multi_step_logprobs: list[list | None] = field(default_factory=list)
