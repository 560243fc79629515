"""The scheduler's side of proposing: which drafts a sequence verifies in a step.

    ngram        NgramProposer (pagedrt/spec/ngram.py): the draft token ids themselves
    draft_model  DraftModelSlots: k slots marked -1, which the device side's draft model
                 (pagedrt/spec/draft_model.py) fills in the step that verifies them

Either way the plan carries `draft_token_ids[req_id]` (pagedrt/core/plan.py) and the
sequence's query length is 1 + len(drafts).
"""

from __future__ import annotations

from typing import Protocol

from pagedrt.core.request import PLACEHOLDER_TOKEN_ID, Request
from pagedrt.spec.config import SpeculativeConfig
from pagedrt.spec.ngram import NgramProposer


class HostProposer(Protocol):
    num_speculative_tokens: int

    def propose(self, req: Request, max_num: int) -> list[int]:
        """Drafts to follow the request's last known token (at most max_num; [] for none)."""

    def has_match(self, req: Request) -> bool:
        """Whether `propose` would find drafts for the request's known tokens."""

    def drop(self, req_id: str) -> None:
        """Forget a finished sequence."""


class DraftModelSlots:
    """Host side of the draft-model method: k slots per sequence, marked -1 (the draft model
    runs on the device side, right before the verification it feeds)."""

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens

    def propose(self, req: Request, max_num: int) -> list[int]:
        return [PLACEHOLDER_TOKEN_ID] * max(min(max_num, self.num_speculative_tokens), 0)

    def has_match(self, req: Request) -> bool:
        return True

    def drop(self, req_id: str) -> None:
        pass


def make_host_proposer(config: SpeculativeConfig) -> HostProposer:
    if config.method == "ngram":
        return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                             config.prompt_lookup_max)
    return DraftModelSlots(config.num_speculative_tokens)
