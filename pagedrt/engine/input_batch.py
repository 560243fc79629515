"""InputBatch: the device side's persistent per-request rows (docs/design.md, "Which side
holds what").

The model runner never reads a `Request`: it keeps one row per sequence it knows, built from
the step plans (pagedrt/core/plan.py) and from the tokens it samples itself, so that a decode
step of 256 rows is a handful of numpy gathers instead of a Python call per request.

    row r:  token_ids[r]    | prompt ............ | generated ... | -1 |   (int32)
                            |<--------------- num_tokens[r] ------------>|
                                                                  ^ a token still being
                            sampled: pending[r] is its index in the sampled ids of step
                            pending_step[r] (async scheduling), -1 once its value is written
            block_table[r]  | b0 | b1 | ... | b(num_blocks[r]-1) | 0 ... |  (int32)
            num_computed_tokens[r]: tokens in the KV cache after the latest step that ran it
                                    (a verification step: after `append_accepted`)
            states[r]: sampling settings, the sample index, the prompt (RowState)
            sampling: the same settings as arrays and device tensors, with the penalties'
                            per-row token counts on the device (SamplingState,
                            pagedrt/engine/sampling_state.py): what the sampler reads
            is_beam[r], beam_scores[r]: a beam slot, and its beam's cumulative
                            log-probability (on the device: written by the beam expansion)
            beam_search[r], beam_slot[r]: its search (an int key of the search's request id,
                            `beam_search_ids`) and its slot
            beam_width[r], beam_stops[r]: its search's width, and whether EOS ends its beams
                            (not with ignore_eos)

A row is created by `NewRequestData` (admission, resumption after preemption) or by a fork,
changed by block-table changes and by sampling (a beam slot also by its expansion:
`reparent_rows`), and freed when a plan lists its request as finished or preempted. A seeded
row's draws depend only on its key and the positions it samples (pagedrt/ops/philox.py), so a
preempted request resumes its random stream where it stopped with nothing kept for it.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedrt.core.plan import NewRequestData, StepPlan
from pagedrt.core.request import PLACEHOLDER_TOKEN_ID
from pagedrt.engine.sampling_state import SamplingState
from pagedrt.sampling_params import SamplingParams


class RowState:
    """The per-row settings the sampler reads (it has the attributes of `SamplingRow`).

    Attributes:
        req_id: the sequence's id.
        params: its sampling settings.
        prompt_token_ids: the prompt (repetition penalty).
        eos_token_ids: the model's EOS ids (min_tokens).
        sample_index: which of the request's n samples (or beam slots) this is.
        beam_group: for a beam slot, the request id of its search; else None.
    """

    __slots__ = ("_batch", "beam_group", "eos_token_ids", "params",
                 "prompt_token_ids", "req_id", "row", "sample_index")

    def __init__(self, batch: InputBatch, row: int, req_id: str, params: SamplingParams,
                 prompt_token_ids: list[int], eos_token_ids: tuple[int, ...], sample_index: int,
                 beam_group: str | None = None) -> None:
        self._batch = batch
        self.row = row
        self.req_id = req_id
        self.params = params
        self.prompt_token_ids = prompt_token_ids
        self.eos_token_ids = eos_token_ids
        self.sample_index = sample_index
        self.beam_group = beam_group

    @property
    def seed(self) -> int | None:
        """The request's seed (its draws: pagedrt/ops/philox.py); None: the runner's default
        generator."""
        return self.params.seed

    @property
    def output_token_ids(self) -> list[int]:
        """Tokens generated so far ([-1] for one still being sampled), from the row."""
        b, r = self._batch, self.row
        return b.token_ids[r, len(self.prompt_token_ids): b.num_tokens[r]].tolist()


class InputBatch:
    """Rows of every sequence the device side knows; see the module docstring."""

    def __init__(self, max_model_len: int, device: torch.device, num_rows: int = 64) -> None:
        self.max_model_len = max_model_len
        self.device = device
        self.token_ids = np.zeros((num_rows, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(num_rows, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(num_rows, dtype=np.int64)
        self.num_computed_tokens = np.zeros(num_rows, dtype=np.int64)
        self.block_table = np.zeros((num_rows, 16), dtype=np.int32)
        self.num_blocks = np.zeros(num_rows, dtype=np.int64)
        self.pending = np.full(num_rows, -1, dtype=np.int64)
        self.pending_step = np.full(num_rows, -1, dtype=np.int64)
        # bumped whenever a row changes hands: a result read after its row was dropped (and
        # maybe reused) must not write into it
        self.epoch = np.zeros(num_rows, dtype=np.int64)
        self.is_beam = np.zeros(num_rows, dtype=np.bool_)
        self.beam_scores = torch.zeros(num_rows, dtype=torch.float32, device=device)
        self.beam_search = np.zeros(num_rows, dtype=np.int64)
        self.beam_slot = np.zeros(num_rows, dtype=np.int64)
        self.beam_width = np.zeros(num_rows, dtype=np.int64)
        self.beam_stops = np.zeros(num_rows, dtype=np.bool_)
        # a search's request id -> [its int key, rows holding it]; key -> request id
        self._beam_keys: dict[str, list[int]] = {}
        self.beam_search_ids: dict[int, str] = {}
        self._next_beam_key = 0
        self.states: list[RowState | None] = [None] * num_rows
        self.sampling = SamplingState(num_rows, device)
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(num_rows - 1, -1, -1))
        # of preempted requests: (pending, pending_step) of the dropped row
        self._parked: dict[str, tuple[int, int]] = {}

    # ----------------------------------------------------------------- rows
    def rows(self, req_ids: list[str]) -> np.ndarray:
        """[len(req_ids)] int64 row of each id (KeyError for an id without a row)."""
        return np.fromiter(map(self.row_of.__getitem__, req_ids), np.int64, len(req_ids))

    def _take_row(self, req_id: str) -> int:
        assert req_id not in self.row_of, f"{req_id} already has row {self.row_of[req_id]}"
        if not self._free_rows:
            n = len(self.states)
            self.token_ids = np.pad(self.token_ids, ((0, n), (0, 0)))
            self.block_table = np.pad(self.block_table, ((0, n), (0, 0)))
            for name in ("num_tokens", "num_prompt_tokens", "num_computed_tokens", "num_blocks",
                         "epoch", "is_beam",
                         "beam_search", "beam_slot", "beam_width", "beam_stops"):
                setattr(self, name, np.pad(getattr(self, name), (0, n)))
            self.beam_scores = torch.cat([self.beam_scores, torch.zeros_like(self.beam_scores)])
            self.pending = np.pad(self.pending, (0, n), constant_values=-1)
            self.pending_step = np.pad(self.pending_step, (0, n), constant_values=-1)
            self.states += [None] * n
            self.sampling.grow(2 * n)
            self._free_rows = list(range(2 * n - 1, n - 1, -1))
        row = self._free_rows.pop()
        self.row_of[req_id] = row
        self.epoch[row] += 1
        return row

    def _drop_row(self, req_id: str, preempted: bool) -> None:
        """Free a request's row; a preempted one keeps where its token still being sampled
        is, for when it resumes (`add_request`)."""
        row = self.row_of.pop(req_id, None)
        if row is None:
            if not preempted:
                self._parked.pop(req_id, None)
                self.sampling.forget(req_id)
            return
        if preempted:
            self._parked[req_id] = (int(self.pending[row]), int(self.pending_step[row]))
        self.sampling.clear_row(row, req_id, preempted)
        self.states[row] = None
        self.block_table[row, : self.num_blocks[row]] = 0
        self.num_tokens[row] = self.num_computed_tokens[row] = self.num_blocks[row] = 0
        self.pending[row] = self.pending_step[row] = -1
        if self.is_beam[row]:
            self.is_beam[row] = False
            key = self.beam_search_ids[int(self.beam_search[row])]
            entry = self._beam_keys[key]
            entry[1] -= 1
            if not entry[1]:
                del self._beam_keys[key], self.beam_search_ids[entry[0]]
        self.epoch[row] += 1
        self._free_rows.append(row)

    def _set_blocks(self, row: int, start: int, block_ids: list[int]) -> None:
        end = start + len(block_ids)
        if end > self.block_table.shape[1]:
            self.block_table = np.pad(self.block_table,
                                      ((0, 0), (0, max(end, 2 * self.block_table.shape[1])
                                                - self.block_table.shape[1])))
        self.block_table[row, start:end] = block_ids
        self.block_table[row, end: self.num_blocks[row]] = 0
        self.num_blocks[row] = end

    def add_request(self, new: NewRequestData) -> int:
        """A row for a request the device side has not seen (or saw before a preemption)."""
        row = self._take_row(new.req_id)
        num_prompt = len(new.prompt_token_ids)
        num_tokens = num_prompt + len(new.output_token_ids)
        assert num_tokens <= self.max_model_len, (
            f"{new.req_id}: {num_tokens} tokens > max_model_len={self.max_model_len}")
        self.token_ids[row, :num_prompt] = new.prompt_token_ids
        self.token_ids[row, num_prompt:num_tokens] = new.output_token_ids
        self.num_tokens[row] = num_tokens
        self.num_prompt_tokens[row] = num_prompt
        self.num_computed_tokens[row] = new.num_computed_tokens
        self.num_blocks[row] = 0
        self._set_blocks(row, 0, new.block_ids)
        pending, pending_step = self._parked.pop(new.req_id, (-1, -1))
        if new.output_token_ids and new.output_token_ids[-1] == PLACEHOLDER_TOKEN_ID:
            # resumed right after a preemption, its last token still being sampled
            assert pending >= 0, f"{new.req_id}: a token in flight, but none was parked"
            # (one token in flight at most: a multi-step plan's tokens are written before
            # any plan can resume its sequences)
            assert new.output_token_ids[-2:-1] != [PLACEHOLDER_TOKEN_ID], (
                f"{new.req_id}: resumed with several tokens in flight")
            self.pending[row], self.pending_step[row] = pending, pending_step
        self.states[row] = RowState(self, row, new.req_id, new.sampling_params,
                                    new.prompt_token_ids, new.eos_token_ids, new.sample_index,
                                    new.beam_group)
        self.sampling.set_row(row, new.req_id, new.sampling_params, new.sample_index,
                              new.prompt_token_ids, new.output_token_ids, new.eos_token_ids)
        if new.beam_group is not None:
            self._mark_beam(row, new.beam_group, new.sample_index, new.beam_score,
                            new.sampling_params)
        return row

    def _mark_beam(self, row: int, search_id: str, slot: int, score: float,
                   params: SamplingParams) -> None:
        entry = self._beam_keys.get(search_id)
        if entry is None:
            entry = self._beam_keys[search_id] = [self._next_beam_key, 0]
            self.beam_search_ids[self._next_beam_key] = search_id
            self._next_beam_key += 1
        entry[1] += 1
        self.is_beam[row] = True
        self.beam_search[row] = entry[0]
        self.beam_slot[row] = slot
        self.beam_width[row] = params.n
        self.beam_stops[row] = not params.ignore_eos
        self.beam_scores[row] = score

    def fork(self, parent_row: int, child_id: str, sample_index: int) -> int:
        """A row for a forked sample: a copy of the parent's row (tokens, computed count,
        block table) with its own sample index. A beam slot's copy has no beam yet (score
        -inf), so its first expansion draws every candidate from the parent."""
        row = self._take_row(child_id)
        p = self.states[parent_row]
        n = int(self.num_tokens[parent_row])
        self.token_ids[row, :n] = self.token_ids[parent_row, :n]
        self.num_tokens[row] = n
        self.num_prompt_tokens[row] = self.num_prompt_tokens[parent_row]
        self.num_computed_tokens[row] = self.num_computed_tokens[parent_row]
        self.num_blocks[row] = 0
        nb = int(self.num_blocks[parent_row])
        self._set_blocks(row, 0, self.block_table[parent_row, :nb])
        self.pending[row] = self.pending[parent_row]
        self.pending_step[row] = self.pending_step[parent_row]
        self.states[row] = RowState(self, row, child_id, p.params, p.prompt_token_ids,
                                    p.eos_token_ids, sample_index,
                                    p.beam_group)
        self.sampling.fork_row(parent_row, row, child_id, p.params,
                               sample_index, p.prompt_token_ids,
                               p.eos_token_ids)
        if p.beam_group is not None:
            self._mark_beam(row, p.beam_group, sample_index, float("-inf"), p.params)
        return row

    def reparent_rows(self, rows: np.ndarray, parent_rows: np.ndarray, num_tokens: np.ndarray,
                      num_blocks: np.ndarray) -> None:
        """Beam slots continue other slots' beams (docs/design.md, "Beam search"): each row
        of `rows` takes the first `num_tokens` tokens and `num_blocks` block-table entries of
        its parent row as they were before the call (its later entries, its own blocks, stay).
        The prompt is the same in both rows: only the tokens after the shortest prompt among
        them are copied. All arguments [m] int64."""
        for table, first, ends in ((self.token_ids, int(self.num_prompt_tokens[rows].min()),
                                    num_tokens), (self.block_table, 0, num_blocks)):
            last = int(ends.max())
            if last > first:
                own = table[rows, first:last]
                take = np.arange(first, last) < ends[:, None]
                table[rows, first:last] = np.where(take, table[parent_rows, first:last], own)

    def apply(self, plan: StepPlan) -> np.ndarray:
        """Bring the rows up to the plan: drop finished and preempted requests, add the new
        ones, write block-table changes. Returns the rows of `plan.req_ids` ([num scheduled]
        int64); the step's computed counts come from the plan (`ModelRunner.prepare`)."""
        for req_id in plan.finished_req_ids:
            self._drop_row(req_id, preempted=False)
        for req_id in plan.preempted_req_ids:
            self._drop_row(req_id, preempted=True)
        for new in plan.new_requests:
            self.add_request(new)
        row_of = self.row_of
        for req_id, (start, block_ids) in plan.block_changes.items():
            row = row_of[req_id]
            assert start <= self.num_blocks[row], (
                f"{req_id}: block change from index {start}, the row has {self.num_blocks[row]}")
            self._set_blocks(row, start, block_ids)
        return self.rows(plan.req_ids)

    def append_sampled(self, rows: np.ndarray, step_id: int) -> np.ndarray:
        """Each row gets one token slot for its token just sampled (row i of the step's
        sampled ids), its value unknown on the host yet; returns the slots' positions."""
        positions = self.num_tokens[rows]
        assert not len(rows) or positions.max() < self.max_model_len, (
            f"a row would pass max_model_len={self.max_model_len}")
        self.token_ids[rows, positions] = PLACEHOLDER_TOKEN_ID
        self.num_tokens[rows] = positions + 1
        self.pending[rows] = np.arange(len(rows))
        self.pending_step[rows] = step_id
        return positions

    def write_sampled(self, req_ids: list[str], rows: np.ndarray, epochs: np.ndarray,
                      positions: np.ndarray, token_ids: list[int], step_id: int) -> None:
        """The values of a step's sampled tokens (see `append_sampled`). A row dropped since
        (finished or preempted) is skipped; a request resumed since in another row whose last
        token is still this one gets it there."""
        if not len(rows):
            return
        same = self.epoch[rows] == epochs
        if not same.all():
            for i in np.flatnonzero(~same).tolist():
                row = self.row_of.get(req_ids[i])
                if (row is not None and self.pending_step[row] == step_id
                        and self.pending[row] == i):
                    self.token_ids[row, self.num_tokens[row] - 1] = token_ids[i]
                    self.pending[row] = self.pending_step[row] = -1
            rows, positions = rows[same], positions[same]
            token_ids = np.asarray(token_ids, dtype=np.int64)[same]
        self.token_ids[rows, positions] = token_ids
        done = rows[self.pending_step[rows] == step_id]
        self.pending[done] = -1
        self.pending_step[done] = -1

    def write_earlier_passes(self, rows: np.ndarray, epochs: np.ndarray,
                             positions: list[np.ndarray], token_ids: list[list[int]]) -> None:
        """The tokens of a multi-step decode's passes before its last (`positions` and
        `token_ids`: one [n] entry each per pass, as `append_sampled` gave the slots; the
        last pass goes through `write_sampled`, which clears the rows' pending token). Rows
        dropped since (their epoch moved on) are skipped."""
        same = self.epoch[rows] == epochs
        rows = rows[same]
        for slots, tokens in zip(positions, token_ids):
            self.token_ids[rows, slots[same]] = np.asarray(tokens, dtype=np.int64)[same]

    def write_drafts(self, row: int, drafts: list[int]) -> None:
        """Put a step's draft tokens past the row's tokens (scratch: num_tokens does not
        count them; the model runner reads them as inputs, `append_accepted` keeps the
        accepted ones)."""
        n = int(self.num_tokens[row])
        assert n + len(drafts) <= self.max_model_len, (
            f"row {row}: {n} tokens + {len(drafts)} drafts > max_model_len={self.max_model_len}")
        self.token_ids[row, n: n + len(drafts)] = drafts

    def append_accepted(self, rows: np.ndarray, epochs: np.ndarray, positions: np.ndarray,
                        extras: list[list[int]]) -> None:
        """Rows that verified drafts: after the first new token (at `positions`, written by
        `write_sampled`) come `extras` (the accepted drafts but the first, then the target's
        token); the computed count moves back to cover only the accepted tokens:

            before the step: computed p - 1 (the row's last token x at p - 1)
            the step computed x and j drafts; a = len(extras) accepted
            after:  tokens ... x d_1 .. d_a t  (num_tokens p + 1 + a), computed p + a

        A row dropped since (finished, preempted) is skipped."""
        for row, epoch, pos, extra in zip(rows.tolist(), epochs.tolist(), positions.tolist(),
                                          extras):
            if self.epoch[row] != epoch:
                continue
            self.token_ids[row, pos + 1: pos + 1 + len(extra)] = extra
            self.num_tokens[row] = pos + 1 + len(extra)
            self.num_computed_tokens[row] = pos + len(extra)

    # ----------------------------------------------------------------- checks
    def row_view(self, req_id: str) -> tuple[list[int], int, list[int]]:
        """(token ids with -1 for a token still being sampled, num_computed_tokens, block ids)
        of a request's row, for integrity checks and tests."""
        row = self.row_of[req_id]
        return (self.token_ids[row, : self.num_tokens[row]].tolist(),
                int(self.num_computed_tokens[row]),
                self.block_table[row, : self.num_blocks[row]].tolist())
