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
max_tokens every candidate ends; what is chosen then is never used.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class BeamExpansion(NamedTuple):
    """Attributes (all on the logits' device):
    values: [G, K] float32 cumulative log-probabilities of the candidates, best first.
    beams: [G, K] int64 slot of each candidate's parent.
    tokens: [G, K] int64 token of each candidate.
    slot_candidates: [G, W] int64 per slot, the candidate index it continues.
    slot_parents: [G, W] int64 per slot, the slot of its parent (== the slot: it stays).
    slot_tokens: [G, W] int64 per slot, its next token.
    slot_scores: [G, W] float32 per slot, its new cumulative log-probability.
    """

    values: torch.Tensor
    beams: torch.Tensor
    tokens: torch.Tensor
    slot_candidates: torch.Tensor
    slot_parents: torch.Tensor
    slot_tokens: torch.Tensor
    slot_scores: torch.Tensor


def expand_beams(logits: torch.Tensor, scores: torch.Tensor, num_candidates: int,
                 stop_token_ids: torch.Tensor, stops: torch.Tensor) -> BeamExpansion:
    """One expansion of G searches of W beams (see the module docstring).

    Args:
        logits: [G * W, V] any float dtype: search g's slot s in row g * W + s.
        scores: [G * W] float32 cumulative log-probability of each slot's beam (-inf: none).
        num_candidates: K, with W <= K <= W * V.
        stop_token_ids: [E] int64 EOS ids (E may be 0).
        stops: [G] bool: the search ends beams at EOS (False with ignore_eos).

    Returns:
        BeamExpansion, every tensor on logits.device.
    """
    num_rows, vocab = logits.shape
    num_groups = stops.shape[0]
    width = num_rows // num_groups
    assert width * num_groups == num_rows and width <= num_candidates <= width * vocab, (
        f"{num_rows} rows for {num_groups} searches, K={num_candidates}, V={vocab}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [G * W, V]
    cumulative = (logprobs + scores.unsqueeze(1)).view(num_groups, width * vocab)
    values, flat = cumulative.topk(num_candidates, dim=1)  # [G, K], sorted
    beams = torch.div(flat, vocab, rounding_mode="floor")
    tokens = flat - beams * vocab
    if stop_token_ids.numel():
        ends = torch.isin(tokens, stop_token_ids) & stops.unsqueeze(1)  # [G, K]
        # candidates that run on first, in their order (a stable sort of the flags)
        running = torch.sort(ends.to(torch.int8), dim=1, stable=True).indices[:, :width]
    else:
        running = torch.arange(width, device=logits.device).expand(num_groups, width)
    parents = beams.gather(1, running)  # [G, W], best first
    slots = assign_slots(parents)  # [G, W]
    slot_candidates = torch.empty_like(running).scatter_(1, slots, running)
    return BeamExpansion(values, beams, tokens, slot_candidates,
                         beams.gather(1, slot_candidates), tokens.gather(1, slot_candidates),
                         values.gather(1, slot_candidates))


def assign_slots(parents: torch.Tensor) -> torch.Tensor:
    """`pagedrt.core.beam.assign_slots` for a batch: parents [G, W] int64 (the slot of each new
    beam's parent, beams best first) -> [G, W] int64 slot of each new beam."""
    width = parents.shape[1]
    device = parents.device
    same = parents.unsqueeze(2) == parents.unsqueeze(1)  # [G, W, W]: beams r, r' share parent
    earlier = torch.ones(width, width, dtype=torch.bool, device=device).tril(-1)  # r' < r
    first = ~(same & earlier).any(dim=2)  # [G, W]: the best child of its parent
    used = torch.zeros_like(first).scatter_(1, parents, True)  # slots that are parents
    # free slots ascending, first: a stable sort of the "used" flags
    free = torch.sort(used.to(torch.int8), dim=1, stable=True).indices
    nth = torch.cumsum((~first).to(torch.int64), dim=1) - 1  # among the other children
    return torch.where(first, parents, free.gather(1, nth.clamp(min=0)))
