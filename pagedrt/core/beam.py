"""Beam search on the host: HF transformers' rules for which candidates finish, which run on,
and when a request is done (docs/design.md, "Beam search").

Each step, the device side expands the W running beams of a request over the vocabulary and
returns its K = max(2, 1 + number of EOS ids) * W best candidates by cumulative log-probability
(value, beam slot, token; best first) and which candidate each slot continues
(`pagedrt/engine/beam_search.py`). `BeamGroup.step` replays HF's bookkeeping on them, with g the
number of generated tokens including the candidate's:

    hit[c]        candidate c ends its sequence: its token is an EOS id (unless ignore_eos),
                  or g == max_tokens
    finished      the candidates among the first W that hit, each scored
                  value / g ** length_penalty, merged into the W best finished hypotheses;
                  skipped once the request cannot improve (below), and with
                  early_stopping=True once W hypotheses are finished
    running       the first W candidates that do not hit (there are always W before max_tokens:
                  each beam has at most one candidate per EOS id among the K)
    improvable    stays True while fewer than W hypotheses are finished, or while the best
                  running value / L ** length_penalty beats the worst finished score, where
                  L = max_tokens if early_stopping == "never" and length_penalty > 0, else g
    done          not improvable; or early_stopping=True and W hypotheses finished; or every
                  candidate hit (max_tokens). The result: the finished hypotheses, best first.

Source: transformers' `GenerationMixin._beam_search` and its helpers `_get_top_k_continuations`,
`_get_running_beams_for_next_iteration`, `_update_finished_beams`, `_check_early_stop_heuristic`
and `_beam_search_has_unfinished_sequences` (transformers 5.x; the same rules since the 4.50
rewrite). Scores are float32 there and here. Where two candidates' values tie exactly, the order
of torch.topk decides in both, and may differ.

`step_searches` applies the same rules to all the searches of one step at once: the common step
(no candidate among the first W ends, g < max_tokens, fewer than W hypotheses finished: only the
scores change) in numpy, the others through `BeamGroup.step`.

Slots: a request's W beams live in W fixed sequences ("slots", `Request.sample_index`), each
with its own device row and block table. When the new running beams are chosen, a parent's best
child stays in the parent's slot and the other children take the slots of beams that left
(`assign_slots`), so a slot's history is copied only when its beam was pruned, and no slot is
both the source and the target of a copy in the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagedrt.sampling_params import BeamSearchParams


def num_beam_candidates(beam_width: int, num_stop_token_ids: int) -> int:
    """K, the candidates kept per step: max(2, 1 + number of EOS ids) * beam_width, so that
    `beam_width` candidates remain to run on even when the best ones all end (HF's
    `beams_to_keep`). num_stop_token_ids: EOS ids that end a beam (0 with ignore_eos)."""
    return max(2, 1 + num_stop_token_ids) * beam_width


def beam_score(cumulative_logprob: float, num_tokens: int, length_penalty: float) -> float:
    """HF's length-penalized score: cumulative_logprob / num_tokens ** length_penalty, in
    float32 (num_tokens: generated tokens, EOS included)."""
    return float(np.float32(cumulative_logprob) / np.float32(num_tokens ** length_penalty))


def assign_slots(parents: list[int]) -> list[int]:
    """The slot of each new beam, given the slot of its parent (beams best first).

    A parent's first (best) child keeps the parent's slot; the other children take, in order,
    the slots whose beams have no child, lowest first. `pagedrt/engine/beam_search.py` does the
    same on the device; both must agree. Example: parents [1, 1, 0, 1] -> slots [1, 2, 0, 3].
    """
    used = set(parents)
    free = iter(s for s in range(len(parents)) if s not in used)
    seen: set[int] = set()
    slots = []
    for p in parents:
        if p in seen:
            slots.append(next(free))
        else:
            seen.add(p)
            slots.append(p)
    return slots


@dataclass
class Hypothesis:
    """A finished sequence of a beam search.

    Attributes:
        token_ids: the generated tokens (an EOS that ended it included).
        cumulative_logprob: sum of the tokens' log-probabilities (float32 sums).
        score: cumulative_logprob / len(token_ids) ** length_penalty.
        finish_reason: "stop" (ended by EOS) or "length" (max_tokens).
    """

    token_ids: list[int]
    cumulative_logprob: float
    score: float
    finish_reason: str


class BeamGroup:
    """The host-side state of one beam-search request, shared by its W slots (`Request.beam`).

    Attributes:
        params: the request's BeamSearchParams.
        width: W.
        stop_token_ids: the EOS ids that end a beam (empty with ignore_eos).
        num_candidates: K (`num_beam_candidates`).
        scores: per slot, the cumulative log-probability of its running beam (float32 values,
            as the device computed them); a slot that has no beam yet holds -inf.
        finished: the finished hypotheses, best first (at most W).
        improvable: HF's "early-stop heuristic unsatisfied".
        done: the search is over; `finished` is the result.
    """

    def __init__(self, params: BeamSearchParams, eos_token_ids: tuple[int, ...]) -> None:
        self.params = params
        self.width = params.beam_width
        self.stop_token_ids = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.num_candidates = num_beam_candidates(self.width, len(self.stop_token_ids))
        self.scores = [0.0] + [-math.inf] * (self.width - 1)
        self.finished: list[Hypothesis] = []
        self.improvable = True
        self.done = False

    def step(self, values: list[float], beams: list[int], tokens: list[int],
             slot_candidates: list[int], num_generated: int) -> list[tuple[int, Hypothesis]]:
        """Apply one expansion (see the module docstring).

        Args:
            values, beams, tokens: the K candidates, best first: cumulative log-probability,
                slot of the parent beam, token.
            slot_candidates: per slot, the candidate its new beam is (the device's choice:
                the first W candidates that do not hit, placed by `assign_slots`).
            num_generated: g, generated tokens including the candidates' tokens.

        Returns:
            (candidate index, hypothesis) for each candidate that entered `finished`, its
            token_ids still empty (the caller knows the parent's tokens). Sets `scores`,
            `improvable` and `done`.
        """
        p = self.params
        width, stop = self.width, self.stop_token_ids
        at_max = num_generated >= p.max_tokens
        new: list[tuple[int, Hypothesis]] = []
        if not at_max and stop.isdisjoint(tokens[:width]):
            # the common step: none of the first W ends, they all run on (no new hypothesis)
            running = list(range(width))
            hits = None
        else:
            hits = [at_max or t in stop for t in tokens]
            running = [c for c, hit in enumerate(hits) if not hit][:width]
        if hits is not None and self.improvable and not (
                p.early_stopping is True and len(self.finished) == width):
            for c in range(width):
                if hits[c]:
                    reason = "stop" if tokens[c] in stop else "length"
                    new.append((c, Hypothesis([], values[c], beam_score(
                        values[c], num_generated, p.length_penalty), reason)))
            if new:
                merged = self.finished + [h for _, h in new]
                merged.sort(key=lambda h: -h.score)  # stable: earlier hypotheses win ties
                self.finished = merged[:width]
                kept = {id(h) for h in self.finished}
                new = [(c, h) for c, h in new if id(h) in kept]
        if not running:  # every candidate ended (max_tokens)
            self.done = True
            return new
        assert sorted(slot_candidates) == running, (
            f"the device continues candidates {slot_candidates}, the rules say {running} "
            f"(tokens {tokens}, stop ids {sorted(stop)})")
        self.scores = [values[c] for c in slot_candidates]
        # (while fewer than W are finished, HF compares with -1e9: the search can improve)
        if self.improvable and len(self.finished) == width:
            length = (p.max_tokens if p.early_stopping == "never" and p.length_penalty > 0
                      else num_generated)
            best = beam_score(values[running[0]], length, p.length_penalty)
            self.improvable = best > min(h.score for h in self.finished)
        self.done = (not self.improvable
                     or (p.early_stopping is True and len(self.finished) == width))
        return new


def step_searches(groups: list[BeamGroup], num_generated: list[int], values: np.ndarray,
                  beams: np.ndarray, tokens: np.ndarray, slot_candidates: np.ndarray
                  ) -> dict[int, list[tuple[int, Hypothesis]]]:
    """`BeamGroup.step` for G searches of one width W expanded in the same step.

    Args:
        groups: the G searches; num_generated: g of each.
        values: [G, K] float32; beams, tokens: [G, K] int64; slot_candidates: [G, W] int64
            (row i: search i's candidates and the device's choice, as `BeamGroup.step` takes
            them).

    Returns:
        search index -> what its `BeamGroup.step` returned, for the searches that took it
        (the others gain no hypothesis and are not done). Sets every search's scores.

    A search takes the common step when none of its first W candidates ends (tested against
    the EOS ids of all the searches together: one that ignores EOS at worst takes the full
    step, which decides alike), g < max_tokens and fewer than W hypotheses are finished: then
    the first W candidates run on, `improvable` cannot change (it is False only once W are
    finished), and only the scores do.
    """
    width = slot_candidates.shape[1]
    slot_values = values[np.arange(len(groups))[:, None], slot_candidates].tolist()
    stop_ids = frozenset().union(*(g.stop_token_ids for g in groups))
    full = np.array([len(g.finished) == width or n >= g.params.max_tokens
                     for g, n in zip(groups, num_generated)], dtype=np.bool_)
    if stop_ids:
        full |= np.isin(tokens[:, :width], list(stop_ids)).any(axis=1)
    common = ~full
    assert (np.sort(slot_candidates[common], axis=1) == np.arange(width)).all(), (
        f"the device continues candidates {slot_candidates[common].tolist()}, the rules say "
        f"the first {width}")
    for g, scores in zip(groups, slot_values):
        g.scores = scores
    return {i: groups[i].step(values[i].tolist(), beams[i].tolist(), tokens[i].tolist(),
                              slot_candidates[i].tolist(), num_generated[i])
            for i in np.flatnonzero(full).tolist()}
