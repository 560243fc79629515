"""The model runner's beam-search part: a step's beam slots are expanded on the device, and the
slots' rows follow the choice (docs/design.md, "Beam search").

In a step that samples the W slots of a search (rows of `InputBatch` with `is_beam`):

  1. `sample`: `expand_beams` on their logits rows and scores; each slot's sampled token is its
     candidate's token (so the next step reads it like any token still being sampled), its
     score the candidate's value (`InputBatch.beam_scores`, on the device). A slot whose parent
     is another slot gets the parent's partial last block copied into its own (the next step
     writes its token there); the copy is made at once, on the device, in stream order.
  2. the rows' host copies (tokens, block tables) are re-parented when the step's results are
     read (`results`, called by `ModelRunner.fetch`): a slot takes its parent's first
     num_tokens tokens and the full blocks of its block table.
  3. with async scheduling the next step is prepared before that: `table_patch` gives
     `ModelRunner.prepare` what it needs to re-parent those block tables on the device
     (the parent of each slot is read from the device, never waited for).

Block ids:  slot s  | shared full blocks (the parent's) ............ | own partial | appended |
                      ^ `reparent_rows`, `table_patch` replace these    ^ contents copied from
                                                                          the parent's, here
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedrt.core.beam import num_beam_candidates
from pagedrt.core.plan import BeamStepResult
from pagedrt.engine.beam_search import expand_beams
from pagedrt.engine.input_batch import InputBatch
from pagedrt.kv.kv_cache import KVCache


@dataclass
class _Bucket:
    """Searches of one (W, K) expanded together. Arrays are [G, W] unless said."""

    group_ids: list[str]
    width: int
    num_candidates: int
    slot_rows: np.ndarray  # InputBatch rows
    slot_epochs: np.ndarray  # their epochs at launch
    num_tokens: np.ndarray  # [G] tokens of the history before the sampled token
    values: torch.Tensor  # [G, K] float32 (pinned host copy on CUDA)
    ints: torch.Tensor  # [G, 2K + 2W] int64: beams, tokens, slot candidates, slot parents


@dataclass
class BeamLaunch:
    """The beam part of a launched step (see `ModelRunner.LaunchedStep`)."""

    buckets: list[_Bucket]


class BeamRunner:
    """Beam expansion and row bookkeeping for one ModelRunner (its InputBatch and KV cache)."""

    def __init__(self, batch: InputBatch, kv_cache: KVCache, device: torch.device) -> None:
        self.batch = batch
        self.kv_cache = kv_cache
        self.device = device
        self.block_size = kv_cache.spec.block_size
        # [sampled rows of the latest launched step] int64 on the device: per row, the index
        # (in that step's sampled rows) of the row whose history it continues (itself but for
        # re-parented beam slots); None when that step expanded no beam
        self.last_parent_index: torch.Tensor | None = None
        self._stop_ids: dict[tuple[int, ...], torch.Tensor] = {}

    # ----------------------------------------------------------------- launch
    def sample(self, logits: torch.Tensor, sampled_rows: np.ndarray, states: list,
               beam_index: np.ndarray, scheduled_pos: np.ndarray, block_tables: torch.Tensor,
               token_ids: torch.Tensor) -> BeamLaunch:
        """Expand the searches whose slots are among a step's sampled rows.

        Args:
            logits: [num_sampled, V] of the sampled rows.
            sampled_rows: [num_sampled] int64 their InputBatch rows; states: their RowStates.
            beam_index: [b] int64 positions (in the sampled rows) of beam slots.
            scheduled_pos: [num_sampled] int64 each sampled row's position among the step's
                scheduled rows (-1: forked this step).
            block_tables: [num_scheduled, width] int32 on the device, the step's tables.
            token_ids: [num_sampled] int64 on the device: the slots' tokens are written here.
        """
        batch = self.batch
        # the slots of each search, in slot order: sort by (search, slot)
        beam_rows = sampled_rows[beam_index]
        order = np.lexsort((batch.beam_slot[beam_rows], batch.beam_search[beam_rows]))
        index, beam_rows = beam_index[order], beam_rows[order]
        keys = batch.beam_search[beam_rows]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        widths = np.diff(np.r_[starts, len(keys)])
        assert (batch.beam_slot[beam_rows] == np.arange(len(keys)) - np.repeat(starts, widths)
                ).all(), f"beam slots sampled: {batch.beam_slot[beam_rows].tolist()}"
        buckets: dict[tuple[int, int], list] = {}
        eos = states[index[0]].eos_token_ids
        for start, width, i in zip(starts.tolist(), widths.tolist(), index[starts].tolist()):
            params = states[i].params
            assert width == params.n, f"{width} slots of a search of width {params.n} sampled"
            stops = not params.ignore_eos
            k = num_beam_candidates(width, len(eos) if stops else 0)
            buckets.setdefault((width, k), []).append((start, stops))
        parent_index = torch.arange(len(sampled_rows), device=self.device)
        launched = []
        for (width, k), members in buckets.items():
            starts_k = np.array([m[0] for m in members], dtype=np.int64)
            group_index = index[starts_k[:, None] + np.arange(width)]  # [G, W]
            stops = np.array([m[1] for m in members], dtype=np.int64)
            launched.append(self._expand(logits, sampled_rows, width, k, group_index, stops,
                                         eos, scheduled_pos, block_tables, token_ids,
                                         parent_index))
        self.last_parent_index = parent_index
        return BeamLaunch(launched)

    def _expand(self, logits, sampled_rows, width, k, index, stops, eos, scheduled_pos,
                block_tables, token_ids, parent_index) -> _Bucket:
        """Expand the searches of one (W, K): index [G, W] their slots' sampled positions,
        stops [G] 1 where EOS ends a beam."""
        batch, bs = self.batch, self.block_size
        rows = sampled_rows[index]
        positions = scheduled_pos[index]
        num_tokens = batch.num_tokens[rows[:, 0]]  # before this step's token is appended
        # partial-block copies: searches whose slots all ran in this step (not just forked)
        # and whose next token goes into a partly filled block
        copy = np.flatnonzero((positions >= 0).all(axis=1) & (num_tokens % bs != 0))
        num_groups = len(index)
        parts = [index.ravel(), rows.ravel(), stops, copy, positions[copy].ravel(),
                 num_tokens[copy] // bs]
        flat = torch.from_numpy(np.concatenate(parts))
        if self.device.type == "cuda":
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        index_t, rows_t, stops_t, copy_t, pos_t, nblk_t = torch.split(
            flat, [len(p) for p in parts])
        index_t, rows_t = index_t.view(num_groups, width), rows_t.view(num_groups, width)
        stop_ids = self._stop_ids.get(eos)
        if stop_ids is None:
            stop_ids = self._stop_ids[eos] = torch.tensor(eos, dtype=torch.int64,
                                                          device=self.device)
        flat_rows = rows_t.reshape(-1)
        out = expand_beams(logits.index_select(0, index_t.reshape(-1)),
                           batch.beam_scores.index_select(0, flat_rows), k, stop_ids,
                           stops_t.bool())
        token_ids.index_copy_(0, index_t.reshape(-1), out.slot_tokens.reshape(-1))
        batch.beam_scores.index_copy_(0, flat_rows, out.slot_scores.reshape(-1))
        parent_index.index_copy_(0, index_t.reshape(-1),
                                 index_t.gather(1, out.slot_parents).reshape(-1))
        if len(copy):
            pos = pos_t.view(len(copy), width)
            column = nblk_t.unsqueeze(1)  # the partial block's index in the tables
            src = block_tables[pos.gather(1, out.slot_parents.index_select(0, copy_t)), column]
            dst = block_tables[pos, column]
            self.kv_cache.gather_copy_blocks(src.reshape(-1).long(), dst.reshape(-1).long())
        ints = torch.cat([out.beams, out.tokens, out.slot_candidates, out.slot_parents], dim=1)
        values = out.values
        if self.device.type == "cuda":  # copied to the host as the step ends (fetch waits)
            host_ints = torch.empty(ints.shape, dtype=torch.int64, pin_memory=True)
            host_values = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
            host_ints.copy_(ints, non_blocking=True)
            host_values.copy_(values, non_blocking=True)
            ints, values = host_ints, host_values
        names = batch.beam_search_ids
        return _Bucket([names[key] for key in batch.beam_search[rows[:, 0]].tolist()], width, k,
                       rows, batch.epoch[rows].copy(), num_tokens, values, ints)

    # ----------------------------------------------------------------- the next step
    def table_patch(self, rows: np.ndarray, pend: np.ndarray, starts: np.ndarray,
                    num_last_sampled: int) -> list[np.ndarray] | None:
        """Host arrays for re-parenting, on the device, the block tables of beam slots that
        the step in flight expanded (async scheduling; see `apply_table_patch`), or None.

        Args:
            rows: [n] the scheduled rows; pend: positions (in rows) of those whose last token
                the step in flight still samples; starts: [n] their computed tokens.
            num_last_sampled: rows the step in flight samples.
        Returns:
            [position in that step's sampled rows -> scheduled position ([num_last_sampled]),
             positions of the slots to patch, their index in that step's sampled rows, the
             number of leading table entries to take from the parent], or None.
        """
        if self.last_parent_index is None or not len(pend):
            return None
        slots = pend[self.batch.is_beam[rows[pend]]]
        num_blocks = starts[slots] // self.block_size  # the full blocks of the history
        slots, num_blocks = slots[num_blocks > 0], num_blocks[num_blocks > 0]
        if not len(slots):
            return None
        pending = self.batch.pending[rows]
        scheduled_of = np.zeros(num_last_sampled, dtype=np.int64)
        scheduled_of[pending[pend]] = pend
        return [scheduled_of, slots, pending[slots], num_blocks]

    def apply_table_patch(self, block_tables: torch.Tensor, patch: list[torch.Tensor]) -> None:
        """Each patched slot's first entries become its parent's (`table_patch`, on the
        device). block_tables: [n, width] int32, changed in place."""
        scheduled_of, slots, sampled, num_blocks = patch
        parents = scheduled_of.index_select(0, self.last_parent_index.index_select(0, sampled))
        width = block_tables.shape[1]
        take = torch.arange(width, device=block_tables.device) < num_blocks.unsqueeze(1)
        block_tables[slots] = torch.where(take, block_tables.index_select(0, parents),
                                          block_tables.index_select(0, slots))

    # ----------------------------------------------------------------- results
    def results(self, launch: BeamLaunch) -> list[BeamStepResult]:
        """The step's candidates per search (its launch is done); re-parents the host copies
        of the slots' rows (unless a row changed hands since: the search was dropped)."""
        out = []
        batch, bs = self.batch, self.block_size
        for b in launch.buckets:
            k, w = b.num_candidates, b.width
            ints = b.ints.numpy() if b.ints.device.type == "cpu" else b.ints.cpu().numpy()
            values, ints_list = b.values.tolist(), ints.tolist()
            for g, group_id in enumerate(b.group_ids):
                row = ints_list[g]
                out.append(BeamStepResult(group_id, values[g], row[:k], row[k:2 * k],
                                          row[2 * k:2 * k + w]))
            # the moved slots of searches whose rows are still theirs, one numpy op per length
            parents = ints[:, 2 * k + w:]  # [G, W] slot of each slot's parent
            moved = (parents != np.arange(w)) & (
                batch.epoch[b.slot_rows] == b.slot_epochs).all(axis=1, keepdims=True)
            if not moved.any():
                continue
            groups, slots = np.nonzero(moved)
            rows = b.slot_rows[groups, slots]
            parent_rows = b.slot_rows[groups, parents[groups, slots]]
            num_tokens = b.num_tokens[groups]
            for n in np.unique(num_tokens).tolist():
                same = num_tokens == n
                batch.reparent_rows(rows[same], parent_rows[same], n, n // bs)
        return out
