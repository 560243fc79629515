"""SamplingState: the sampling settings of the device side's rows as arrays, so that a step
samples its whole batch with tensor ops and no Python per request (docs/design.md, "Host work
per step").

One entry per `InputBatch` row, written when a row is taken (admission, resumption, fork) or
freed, never rebuilt per step:

    host (numpy, [rows]):   flags read to choose the step's ops: greedy, plain greedy, seeded
                            (with its key), wants logprobs, penalized; top_k (0: off), top_p,
                            min_p; min_tokens
                            and the prompt length (min_tokens is active while num_tokens -
                            prompt length < min_tokens); stop_ids [rows, S] (stop_token_ids and,
                            unless ignore_eos, EOS; -1 pads); penalty_slot (-1: none)
    device, [rows, 8] f32:  temperature (1 for greedy rows), top_k, top_p, min_p, repetition,
                            frequency and presence penalty, greedy (1.0 / 0.0): a mirror of
                            the host values, copied whole (a few KB) before a step that follows
                            a change
    device, [slots, vocab]: output_counts (int32) and prompt_seen (bool), one slot per
                            penalized row: what the penalties read. A slot is initialized from
                            the host's token ids when its row is taken, then counts each token
                            the row samples (`count`, a scatter-add on the device: no host
                            tokens needed, so penalties work with async scheduling)
    bias (`AdditiveRows`):  logit_bias, allowed_token_ids and single-token bad words, a
                            [vocab] float32 row on the device per batch row that has any,
                            built once when the row is taken (pagedrt/engine/logit_bias.py)
    bad_words (host):       the bad-word token sequences of two tokens or more of the rows
                            that have them (`BadWordSequences`, pagedrt/engine/bad_words.py),
                            matched against each row's generated tokens per step

A preempted row's slot is parked with its request (`InputBatch`): its
counts already hold the token still being sampled when it was preempted. A fork's slot starts
as a copy of its parent's. Inits and copies queue until the next `flush` (the vocabulary size
is known there, from the logits).
"""

from __future__ import annotations

import numpy as np
import torch

from pagedrt.engine.bad_words import BadWordSequences
from pagedrt.engine.host_buffers import to_device
from pagedrt.engine.logit_bias import AdditiveRows
from pagedrt.sampling_params import SamplingParams

TEMPERATURE, TOP_K, TOP_P, MIN_P, REPETITION, FREQUENCY, PRESENCE, GREEDY = range(8)
NUM_PARAMS = 8



def seed_key(seed: int, sample_index: int) -> int:
    """The draw key of sample `sample_index` of a request with seed `seed`
    (pagedrt/ops/philox.py): their sum, as vLLM seeds the n samples of a request, wrapped to
    int64 (a seed may be any 64-bit int)."""
    return (seed + sample_index + 2**63) % 2**64 - 2**63

class SamplingState:
    """Per-row sampling settings and penalty counts; see the module docstring."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        self.device = device
        self.params = np.zeros((num_rows, NUM_PARAMS), dtype=np.float32)
        self.greedy = np.zeros(num_rows, dtype=np.bool_)
        self.plain_greedy = np.zeros(num_rows, dtype=np.bool_)  # nothing changes the argmax
        self.seeded = np.zeros(num_rows, dtype=np.bool_)  # draws from its own key
        self.seed_key = np.zeros(num_rows, dtype=np.int64)  # its key (sampler.seed_key)
        self.wants_logprobs = np.zeros(num_rows, dtype=np.bool_)
        self.penalized = np.zeros(num_rows, dtype=np.bool_)
        self.top_k = np.zeros(num_rows, dtype=np.int64)
        self.min_tokens = np.zeros(num_rows, dtype=np.int64)
        self.prompt_len = np.zeros(num_rows, dtype=np.int64)
        self.stop_ids = np.full((num_rows, 1), -1, dtype=np.int64)
        self.penalty_slot = np.full(num_rows, -1, dtype=np.int64)
        self._device_params: torch.Tensor | None = None  # None: changed since the last copy
        self.output_counts: torch.Tensor | None = None  # [slots, vocab] int32
        self.prompt_seen: torch.Tensor | None = None  # [slots, vocab] bool
        self._num_slots = 0
        self._free_slots: list[int] = []
        self._parked_slots: dict[str, int] = {}
        self._pending_inits: list[tuple[int, list[int], list[int]]] = []
        self._pending_copies: list[tuple[int, int]] = []
        self.bias = AdditiveRows(num_rows)
        self.bad_words = BadWordSequences()

    # ----------------------------------------------------------------- rows
    def grow(self, num_rows: int) -> None:
        """Room for `num_rows` rows (the InputBatch grew)."""
        extra = num_rows - len(self.greedy)
        if extra <= 0:
            return
        self.params = np.pad(self.params, ((0, extra), (0, 0)))
        for name in ("greedy", "plain_greedy", "seeded", "seed_key", "wants_logprobs",
                     "penalized",
                     "top_k", "min_tokens", "prompt_len"):
            setattr(self, name, np.pad(getattr(self, name), (0, extra)))
        self.stop_ids = np.pad(self.stop_ids, ((0, extra), (0, 0)), constant_values=-1)
        self.penalty_slot = np.pad(self.penalty_slot, (0, extra), constant_values=-1)
        self.bias.grow(num_rows)
        self._device_params = None

    def set_row(self, row: int, req_id: str, params: SamplingParams, sample_index: int,
                prompt_token_ids: list[int], output_token_ids: list[int],
                eos_token_ids: tuple[int, ...]) -> None:
        """A row taken by a request: its settings, a penalty slot (its parked one, if it
        was preempted; else one initialized from the token ids, placeholders left out), and
        its additive row where it has logit_bias, allowed_token_ids or a single-token bad
        word, and its bad-word sequences of several tokens."""
        greedy = params.greedy
        penalized = params.reads_output_tokens
        self.params[row] = (1.0 if greedy else params.temperature, max(params.top_k, 0),
                            params.top_p, params.min_p, params.repetition_penalty,
                            params.frequency_penalty, params.presence_penalty, float(greedy))
        self.greedy[row] = greedy
        self.plain_greedy[row] = (greedy and params.logprobs is None and not params.min_tokens
                                  and not penalized and not params.adjusts_logits)
        self.seeded[row] = params.seed is not None and not greedy
        self.seed_key[row] = 0 if params.seed is None else seed_key(params.seed, sample_index)
        self.wants_logprobs[row] = params.logprobs is not None
        self.penalized[row] = penalized
        self.top_k[row] = max(params.top_k, 0)
        self.min_tokens[row] = params.min_tokens
        self.prompt_len[row] = len(prompt_token_ids)
        stop = sorted(set(params.stop_token_ids).union(
            () if params.ignore_eos else eos_token_ids)) if params.min_tokens else []
        if len(stop) > self.stop_ids.shape[1]:
            self.stop_ids = np.pad(self.stop_ids, ((0, 0), (0, len(stop) - self.stop_ids.shape[1])),
                                   constant_values=-1)
        self.stop_ids[row] = -1
        self.stop_ids[row, : len(stop)] = stop
        if penalized:
            slot = self._parked_slots.pop(req_id, None)
            if slot is None:
                slot = self._take_slot()
                self._pending_inits.append((slot, list(prompt_token_ids),
                                            [t for t in output_token_ids if t >= 0]))
            self.penalty_slot[row] = slot
        self.bias.set_row(row, params)
        self.bad_words.set_row(row, params)
        self._device_params = None

    def fork_row(self, parent: int, row: int, req_id: str, params: SamplingParams,
                 sample_index: int, prompt_token_ids: list[int],
                 eos_token_ids: tuple[int, ...]) -> None:
        """A forked sample's row: its parent's settings; its penalty counts a copy of the
        parent's."""
        self.set_row(row, req_id, params, sample_index, prompt_token_ids, [], eos_token_ids)
        if self.penalty_slot[row] >= 0:
            # the slot set_row queued an init for: a copy of the parent's instead
            slot = int(self.penalty_slot[row])
            self._pending_inits = [e for e in self._pending_inits if e[0] != slot]
            self._pending_copies.append((int(self.penalty_slot[parent]), slot))

    def clear_row(self, row: int, req_id: str, preempted: bool) -> None:
        """A row freed: its penalty slot is parked with a preempted request, else freed; its
        additive row's slot and its bad-word sequences are dropped (a resumed request gets
        them again)."""
        slot = int(self.penalty_slot[row])
        if slot >= 0:
            if preempted:
                self._parked_slots[req_id] = slot
            else:
                self._free_slot(slot)
            self.penalty_slot[row] = -1
        self.penalized[row] = self.seeded[row] = self.wants_logprobs[row] = False
        self.plain_greedy[row] = self.greedy[row] = False
        self.min_tokens[row] = 0
        self.bias.clear_row(row)
        self.bad_words.clear_row(row)

    def forget(self, req_id: str) -> None:
        """A preempted request finished: its parked slot is freed."""
        slot = self._parked_slots.pop(req_id, None)
        if slot is not None:
            self._free_slot(slot)

    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        self._num_slots += 1
        return self._num_slots - 1

    def _free_slot(self, slot: int) -> None:
        self._free_slots.append(slot)
        # an init still queued for it is moot
        self._pending_inits = [e for e in self._pending_inits if e[0] != slot]

    # ----------------------------------------------------------------- device
    def device_params(self) -> torch.Tensor:
        """[rows, 8] float32 on the device (columns: TEMPERATURE ... GREEDY), copied from the
        host mirror if it changed since the last call (pinned and non-blocking on CUDA)."""
        if self._device_params is None:
            self._device_params = to_device(self.params.copy(), self.device)
        return self._device_params

    def flush(self, vocab_size: int) -> None:
        """Apply the queued slot inits and copies (before a step samples: they are on the
        device stream before its penalties read the counts), and build the queued additive
        rows. Grows the count tensors to hold every slot."""
        self.bias.flush(vocab_size, self.device)
        if not (self._pending_inits or self._pending_copies):
            return
        device = self.device
        if self.output_counts is None or self.output_counts.shape[0] < self._num_slots:
            size = max(self._num_slots, 2 * (0 if self.output_counts is None
                                             else self.output_counts.shape[0]), 8)
            counts = torch.zeros(size, vocab_size, dtype=torch.int32, device=device)
            seen = torch.zeros(size, vocab_size, dtype=torch.bool, device=device)
            if self.output_counts is not None:
                counts[: self.output_counts.shape[0]] = self.output_counts
                seen[: self.prompt_seen.shape[0]] = self.prompt_seen
            self.output_counts, self.prompt_seen = counts, seen
        if self._pending_inits:
            slots = [e[0] for e in self._pending_inits]
            prompts = _padded([e[1] for e in self._pending_inits], vocab_size)
            outputs = _padded([e[2] for e in self._pending_inits], vocab_size)
            index = to_device(np.concatenate([slots, prompts.ravel(), outputs.ravel()]), device)
            n = len(slots)
            slot_t, prompt_t, output_t = torch.split(index, [n, prompts.size, outputs.size])
            # a padding column at vocab_size takes the padding entries, then is dropped
            seen = torch.zeros(n, vocab_size + 1, dtype=torch.bool, device=device)
            seen.scatter_(1, prompt_t.view(prompts.shape), True)
            counts = torch.zeros(n, vocab_size + 1, dtype=torch.int32, device=device)
            output_t = output_t.view(outputs.shape)
            counts.scatter_add_(1, output_t, torch.ones_like(output_t, dtype=torch.int32))
            self.prompt_seen[slot_t] = seen[:, :vocab_size]
            self.output_counts[slot_t] = counts[:, :vocab_size]
            self._pending_inits = []
        for src, dst in self._pending_copies:
            self.output_counts[dst] = self.output_counts[src]
            self.prompt_seen[dst] = self.prompt_seen[src]
        self._pending_copies = []

    def count(self, slots: torch.Tensor, token_ids: torch.Tensor,
              valid: torch.Tensor | None = None) -> None:
        """Add sampled tokens to their rows' output counts, on the device.

        Args:
            slots: [n] int64 penalty slots on the device.
            token_ids: [n] or [n, k] int64 on the device, the tokens of each slot's row.
            valid: like token_ids, bool: which of them count (None: all).
        """
        if token_ids.dim() == 2:
            slots = slots.unsqueeze(1).expand_as(token_ids)
        ones = (torch.ones_like(token_ids, dtype=torch.int32) if valid is None
                else valid.to(torch.int32))
        self.output_counts.index_put_((slots.reshape(-1), token_ids.reshape(-1)),
                                      ones.reshape(-1), accumulate=True)


def _padded(lists: list[list[int]], pad: int) -> np.ndarray:
    """[len(lists), longest (at least 1)] int64, each list then `pad`."""
    width = max(max((len(x) for x in lists), default=0), 1)
    out = np.full((len(lists), width), pad, dtype=np.int64)
    for i, x in enumerate(lists):
        out[i, : len(x)] = x
    return out
