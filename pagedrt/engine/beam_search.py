"""Beam expansion on the device: the candidates of a step and the slots' choice among them,
with no host sync (docs/design.md, "Beam search"; the rules are HF transformers', replayed on
the host by `pagedrt/core/beam.py`).

For G searches of W beams each (rows of the step's logits, grouped per search in slot order):

    logprobs   = log_softmax(logits)                     [G, W, V] float32
    cumulative = logprobs + score of the beam            [G, W, V]   (a slot without a beam
                                                                       scores -inf)
    candidates = topk over the W * V flattened           [G, K]      value, beam (// V),
                                                                       token (% V), best first
    running    = the first W candidates whose token does not end the beam (EOS; not with
                 ignore_eos), best first                  [G, W]
    slots      = `assign_slots` of their parents: a parent's best child keeps its slot, the
                 others take the slots of beams that left, lowest first

A slot's next input token is its candidate's token, its score the candidate's value. At
max_tokens every candidate ends; what is chosen then is never used. `top_candidates` computes
the candidates, `choose_slots` the rest (`pagedrt/ops/beam_triton.py` has the rest as one
kernel).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class BeamExpansion(NamedTuple):
    """Attributes (all on the logits' device):
    values: [G, K] float32 cumulative log-probabilities of the candidates, best first.
    flat: [G, K] int64 each candidate's index in its search's W x V scores: beam * V + token.
    slot_candidates: [G, W] int64 per slot, the candidate index it continues.
    slot_parents: [G, W] int64 per slot, the slot of its parent (== the slot: it stays).
    slot_tokens: [G, W] int64 per slot, its next token.
    slot_scores: [G, W] float32 per slot, its new cumulative log-probability.
    """

    values: torch.Tensor
    flat: torch.Tensor
    slot_candidates: torch.Tensor
    slot_parents: torch.Tensor
    slot_tokens: torch.Tensor
    slot_scores: torch.Tensor


def expand_beams(logits: torch.Tensor, scores: torch.Tensor, width: int, num_candidates: int,
                 stop_token_ids: torch.Tensor | None) -> BeamExpansion:
    """One expansion of G searches of W beams (see the module docstring), in about 20 tensor
    ops whatever G (each a kernel launch on a GPU), none of which waits for the device:
    `choose_slots(*top_candidates(...))`.

    Args:
        logits: [G * W, V] any float dtype: search g's slot s in row g * W + s.
        scores: [G * W] float32 cumulative log-probability of each slot's beam (-inf: none).
        width: W; num_candidates: K, with W <= K <= W * V.
        stop_token_ids: [G, E] int64 the EOS ids that end each search's beams (-1: none, for
            a search with ignore_eos), or None when no search of the batch ends at EOS.

    Returns:
        BeamExpansion, every tensor on logits.device.
    """
    values, flat = top_candidates(logits, scores, width, num_candidates)
    return choose_slots(values, flat, logits.shape[1], width, stop_token_ids)


def top_candidates(logits: torch.Tensor, scores: torch.Tensor, width: int,
                   num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K best candidates of each search (arguments as `expand_beams`): values [G, K]
    float32, best first, and their indices in the search's W x V scores ([G, K] int64,
    beam * V + token). 3 or 4 tensor ops."""
    num_rows, vocab = logits.shape
    num_groups = num_rows // width
    assert num_groups * width == num_rows and width <= num_candidates <= width * vocab, (
        f"{num_rows} rows of searches of width {width}, K={num_candidates}, V={vocab}")
    # (in place on the float32 log-probabilities: the same values as HF's out-of-place sum)
    cumulative = torch.log_softmax(logits.float(), dim=-1).add_(scores.unsqueeze(1))
    return cumulative.view(num_groups, width * vocab).topk(num_candidates, dim=1)


def choose_slots(values: torch.Tensor, flat: torch.Tensor, vocab_size: int, width: int,
                 stop_token_ids: torch.Tensor | None) -> BeamExpansion:
    """The running beams among `top_candidates`' and their slots (arguments as
    `expand_beams`; `pagedrt/ops/beam_triton.py` does the same in one kernel)."""
    beams = torch.div(flat, vocab_size, rounding_mode="floor")  # [G, K]
    if stop_token_ids is None:  # the first W run on
        running = None
        parents = beams[:, :width]
    else:
        tokens = flat.remainder(vocab_size)
        ends = (tokens.unsqueeze(2) == stop_token_ids.unsqueeze(1)).sum(2)  # [G, K] 0 or 1
        # candidates that run on first, in their order (a stable sort of the flags)
        running = torch.sort(ends, dim=1, stable=True).indices[:, :width]
        parents = beams.gather(1, running)  # [G, W], best first
    # slot -> the rank of its new beam among the running ones: the inverse permutation
    slot_rank = torch.argsort(assign_slots(parents), dim=1)
    slot_candidates = slot_rank if running is None else running.gather(1, slot_rank)
    slot_flat = flat.gather(1, slot_candidates)
    return BeamExpansion(values, flat, slot_candidates, beams.gather(1, slot_candidates),
                         slot_flat.remainder(vocab_size), values.gather(1, slot_candidates))


_LOWER: dict[tuple[int, torch.device], torch.Tensor] = {}


def assign_slots(parents: torch.Tensor) -> torch.Tensor:
    """`pagedrt.core.beam.assign_slots` for a batch: parents [G, W] int64 (the slot of each new
    beam's parent, beams best first) -> [G, W] int64 slot of each new beam (11 tensor ops)."""
    width = parents.shape[1]
    key = (width, parents.device)
    earlier = _LOWER.get(key)
    if earlier is None:  # [r, r'] = r' < r
        earlier = _LOWER[key] = torch.ones(width, width, dtype=torch.bool,
                                           device=parents.device).tril(-1)
    same = parents.unsqueeze(2) == parents.unsqueeze(1)  # [G, W, W]: beams r, r' share parent
    later = (same & earlier).any(dim=2)  # [G, W]: not the best child of its parent
    used = torch.zeros_like(later).scatter_(1, parents, True)  # slots that are parents
    # free slots ascending, first: a stable sort of the "used" flags
    free = torch.sort(used.to(torch.int8), dim=1, stable=True).indices
    # the n-th later child (n = 1, 2, ...: an inclusive count) takes free slot n - 1, which
    # sits at index n of free rolled by one (every index stays below W: there are at most
    # W - 1 later children)
    nth = later.cumsum(dim=1)
    return torch.where(later, free.roll(1, dims=1).gather(1, nth), parents)
