"""The per-sequence switch-off rule of speculative decoding: a sequence whose drafts are mostly
rejected stops proposing for a while, with exponential backoff.

Why: a verification step is read back before the next plan (docs/design.md, "Speculative
decoding"), so a speculating sequence gives up the async overlap of host and device, and its
drafts cost extra tokens in the forward pass. That pays only while enough drafts are accepted.
The batch-size rule (`disable_by_batch_size`, pagedrt/spec/config.py) cannot see a sequence
whose text stopped repeating itself (an n-gram that matches once, then the answer goes its own
way), so each sequence is also judged on its own acceptance:

    accepted length of a verification step = accepted drafts + 1 (the target's own token),
        the quantity whose mean `llm.stats()` reports as spec_decode_mean_accepted_length
    after each verification step, once the sequence has WINDOW of them since it last
        (re)started speculating: if their mean < min_mean_accepted_length, pause
    a pause lasts FIRST_PAUSE_STEPS engine steps, then twice as long at each further pause
        (8, 16, 32, ...), at most MAX_PAUSE_STEPS; a full window at or above the bound sets
        the next pause back to FIRST_PAUSE_STEPS

While paused, the sequence gets no drafts and does not make the engine read the step in flight
early for it (with async scheduling its steps overlap again). Greedy tokens do not depend on the
rule: drafts only decide how many tokens a step yields, never which. A bound of 1 or less never
pauses (every step yields at least one token).
"""

from __future__ import annotations

from collections import deque

WINDOW = 4
"""Verification steps a sequence's mean is taken over (the latest ones since it last started
speculating): few enough to react within a short answer, more than one so that a single
unlucky step does not pause it."""
FIRST_PAUSE_STEPS = 8
MAX_PAUSE_STEPS = 256


class _SequenceState:
    __slots__ = ("next_pause", "paused_until", "recent")

    def __init__(self) -> None:
        self.recent: deque[int] = deque(maxlen=WINDOW)  # accepted lengths, latest last
        self.next_pause = FIRST_PAUSE_STEPS
        self.paused_until = 0  # the first step id that may speculate again


class AcceptanceRule:
    """Per-sequence pauses of speculation (see the module docstring); the scheduler asks it
    before proposing and tells it each verification's result.

    Args:
        min_mean_accepted_length: the bound on the mean accepted length (tokens per
            verification step, from 1 to k + 1); <= 1 never pauses.

    Attributes:
        num_pauses: pauses started since creation (llm.stats()'s spec_decode_num_pauses).
    """

    def __init__(self, min_mean_accepted_length: float) -> None:
        self.min_mean_accepted_length = float(min_mean_accepted_length)
        self.enabled = self.min_mean_accepted_length > 1.0
        self.num_pauses = 0
        self._states: dict[str, _SequenceState] = {}

    def may_speculate(self, req_id: str, step_id: int) -> bool:
        """Whether the sequence may get drafts in the plan with this step id."""
        state = self._states.get(req_id)
        return state is None or step_id >= state.paused_until

    def record(self, req_id: str, accepted_length: int, step_id: int) -> None:
        """A verification step of the sequence (the plan's step id) yielded `accepted_length`
        tokens (accepted drafts + 1); pauses the sequence when its window falls below the
        bound."""
        if not self.enabled:
            return
        state = self._states.get(req_id)
        if state is None:
            state = self._states[req_id] = _SequenceState()
        recent = state.recent
        recent.append(accepted_length)
        if len(recent) < WINDOW:
            return
        if sum(recent) >= self.min_mean_accepted_length * WINDOW:
            state.next_pause = FIRST_PAUSE_STEPS
            return
        # paused for the next `pause` plans; judged afresh on a new window after that
        state.paused_until = step_id + 1 + state.next_pause
        state.next_pause = min(2 * state.next_pause, MAX_PAUSE_STEPS)
        recent.clear()
        self.num_pauses += 1

    def drop(self, req_id: str) -> None:
        """Forget a finished sequence."""
        self._states.pop(req_id, None)
