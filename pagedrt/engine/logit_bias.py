"""logit_bias, allowed_token_ids and single-token bad words as one additive row per request
(docs/design.md, "Logit bias and allowed tokens", "Bad words").

A request with any of them (`has_additive_row`) has an additive row `a` of [vocab] float32:

    a[t] = logit_bias.get(t, 0)   where allowed_token_ids is None or holds t, and no bad word
                                  is the one token t
    a[t] = -inf                   elsewhere

and its logits become `logits + a` before anything else shapes them (penalties, min_tokens,
temperature, the filters). Adding 0.0 leaves a logit as it is and -inf plus a finite bias is
-inf, so one float32 add per entry gives both settings, on either sampler path: the plain
`Sampler.__call__` builds the rows of its batch each call (`additive_rows`), the batched
`Sampler.sample_rows` keeps them in `AdditiveRows`, built once when a row is taken.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedrt.engine.bad_words import single_token_bans
from pagedrt.engine.host_buffers import to_device
from pagedrt.sampling_params import SamplingParams


def has_additive_row(params: SamplingParams) -> bool:
    """Whether a request has an additive row: logit_bias, allowed_token_ids, or a bad word of
    one token (longer ones are matched per step: pagedrt/engine/bad_words.py)."""
    return (params.logit_bias is not None or params.allowed_token_ids is not None
            or bool(single_token_bans(params)))


def additive_rows(params: list[SamplingParams], vocab_size: int,
                  device: torch.device) -> torch.Tensor:
    """The additive rows (module docstring) of requests whose params adjust the logits.

    Token ids at or past `vocab_size` are left out (`validation.validate_prompt` refuses them
    before a request is queued). Two host-to-device copies (the ids, the biases) and five
    tensor ops whatever the number of rows. A single-token bad word is a bias of -inf (-inf
    plus any other bias, or plus the 0 of an allowed id, stays -inf).

    Args:
        params: n settings, each with an additive row (`has_additive_row`).
        vocab_size: the logits' width.
        device: where the rows go.

    Returns:
        [n, vocab_size] float32 on `device`.
    """
    n = len(params)
    allowed = [[t for t in p.allowed_token_ids if t < vocab_size]
               if p.allowed_token_ids is not None else [] for p in params]
    biased = [[(t, b) for t, b in (p.logit_bias or {}).items() if t < vocab_size]
              + [(t, float("-inf")) for t in single_token_bans(p) if t < vocab_size]
              for p in params]
    # padding entries go to a column at vocab_size, dropped at the end
    width_a = max(1, max(map(len, allowed), default=0))
    width_b = max(1, max(map(len, biased), default=0))
    allowed_ids = np.full((n, width_a), vocab_size, dtype=np.int64)
    bias_ids = np.full((n, width_b), vocab_size, dtype=np.int64)
    bias_values = np.zeros((n, width_b), dtype=np.float32)
    for i, (ids, pairs) in enumerate(zip(allowed, biased)):
        allowed_ids[i, : len(ids)] = ids
        if pairs:
            bias_ids[i, : len(pairs)], bias_values[i, : len(pairs)] = zip(*pairs)
    masked = np.array([p.allowed_token_ids is not None for p in params], dtype=np.int64)
    index = to_device(np.concatenate([masked, allowed_ids.ravel(), bias_ids.ravel()]), device)
    masked_t, allowed_t, bias_t = torch.split(index, [n, allowed_ids.size, bias_ids.size])
    rows = torch.zeros(n, vocab_size + 1, dtype=torch.float32, device=device)
    rows.masked_fill_(masked_t.bool().unsqueeze(1), float("-inf"))
    rows.scatter_(1, allowed_t.view(allowed_ids.shape), 0.0)
    rows.scatter_add_(1, bias_t.view(bias_ids.shape), to_device(bias_values, device))
    return rows[:, :vocab_size]


class AdditiveRows:
    """The additive rows of the device side's batch rows that have one, kept on the device.

    Host, per batch row: `slot` ([rows] int64), the row's entry in `table`, or -1 (none).
    Device: `table` ([slots, vocab] float32), one row per slot, made by `flush` from the
    params queued by `set_row` (the vocabulary size is known there, from the logits). A slot
    holds a function of the params alone, so a preempted or forked row is simply given a new
    one; nothing is parked. `num_rows` counts the batch rows with a slot: while it is 0 the
    sampler does nothing for these settings.
    """

    def __init__(self, num_rows: int) -> None:
        self.slot = np.full(num_rows, -1, dtype=np.int64)
        self.table: torch.Tensor | None = None
        self.num_rows = 0
        self._num_slots = 0
        self._free_slots: list[int] = []
        self._pending: list[tuple[int, SamplingParams]] = []

    def grow(self, num_rows: int) -> None:
        """Room for `num_rows` batch rows."""
        extra = num_rows - len(self.slot)
        if extra > 0:
            self.slot = np.pad(self.slot, (0, extra), constant_values=-1)

    def set_row(self, row: int, params: SamplingParams) -> None:
        """A batch row taken by a request: a slot, its row queued, where the params have an
        additive row (`has_additive_row`)."""
        if not has_additive_row(params):
            return
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self._num_slots
            self._num_slots += 1
        self._pending.append((slot, params))
        self.slot[row] = slot
        self.num_rows += 1

    def clear_row(self, row: int) -> None:
        """A batch row freed: its slot, if any, goes back (a row still queued for it is
        dropped)."""
        slot = int(self.slot[row])
        if slot < 0:
            return
        self.slot[row] = -1
        self.num_rows -= 1
        self._free_slots.append(slot)
        self._pending = [entry for entry in self._pending if entry[0] != slot]

    def flush(self, vocab_size: int, device: torch.device) -> None:
        """Build the queued rows into `table` (grown to hold every slot) before a step reads
        it."""
        if not self._pending:
            return
        if self.table is None or self.table.shape[0] < self._num_slots:
            old = self.table
            size = max(self._num_slots, 8, 0 if old is None else 2 * old.shape[0])
            self.table = torch.zeros(size, vocab_size, dtype=torch.float32, device=device)
            if old is not None:
                self.table[: old.shape[0]] = old
        slots = to_device([slot for slot, _ in self._pending], device, torch.int64)
        self.table[slots] = additive_rows([p for _, p in self._pending], vocab_size, device)
        self._pending = []
