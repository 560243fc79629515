"""The model runner's beam-search part: a step's beam slots are expanded on the device, and the
slots' rows follow the choice (docs/design.md, "Beam search").

In a step that samples the W slots of a search (rows of `InputBatch` with `is_beam`):

  1. `sample`: the searches of each (W, K) together: their K best candidates from the logits
     rows and scores (`top_candidates`, or its Triton kernels `beam_top_candidates_triton`),
     then the choice (`choose_slots`, or its Triton kernel `beam_choose_triton`); each
     slot's sampled token is its candidate's token (so the next step reads it like any token
     still being sampled), its score the candidate's value (`InputBatch.beam_scores`, on the
     device). A slot whose parent is another slot gets the parent's partial last block copied
     into its own (the next step writes its token there); the copy is made at once, on the
     device, in stream order. One copy in, one copy out, no host sync.
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

from pagedrt.core.plan import BeamStepResult
from pagedrt.engine.beam_search import choose_slots, top_candidates
from pagedrt.engine.host_buffers import StepBuffers
from pagedrt.engine.input_batch import InputBatch
from pagedrt.env_flags import env_flag
from pagedrt.kv.kv_cache import KVCache
from pagedrt.ops.attention import uses_triton

_PAD = np.zeros(1, dtype=np.int64)


@dataclass
class _Bucket:
    """Searches of one (W, K) expanded together. Arrays are [G, W] unless said."""

    group_ids: list[str]
    width: int
    num_candidates: int
    vocab_size: int
    slot_rows: np.ndarray  # InputBatch rows
    slot_epochs: np.ndarray  # their epochs at launch
    num_tokens: np.ndarray  # [G] tokens of the history before the sampled token
    # [G, 2K + 3W] int64 (a pinned host buffer's rows on CUDA, valid once the step is done):
    # the candidates' values (float32 bits as int32), their indices in the W x V scores
    # (beam * V + token), the slots' candidates, parents and tokens
    out: torch.Tensor


@dataclass
class BeamLaunch:
    """The beam part of a launched step (see `ModelRunner.LaunchedStep`)."""

    buckets: list[_Bucket]


class BeamRunner:
    """Beam expansion and row bookkeeping for one ModelRunner (its InputBatch and KV cache).

    Per step and (W, K) of the searches it expands: one host-to-device copy of the rows and
    block ids, the expansion (3 Triton kernels, or about 30 tensor ops: `expand_beams`, the
    slots' tokens and scores), the partial blocks' copies, one device-to-host copy of the
    candidates; no host sync."""

    def __init__(self, batch: InputBatch, kv_cache: KVCache, device: torch.device,
                 max_num_seqs: int = 256, backend: str = "auto") -> None:
        """backend: the attention backend; where it runs Triton kernels, so do the search for
        the candidates (`pagedrt/ops/beam_topk_triton.py`) and the choice among them
        (`pagedrt/ops/beam_triton.py`), unless the environment variable PAGEDRT_BEAM_KERNEL is
        0 (then the torch ops of `top_candidates` and `choose_slots`, as on CPU)."""
        self.batch = batch
        self.kv_cache = kv_cache
        self.device = device
        self.backend = backend
        self.use_kernel = env_flag("PAGEDRT_BEAM_KERNEL")
        self.block_size = kv_cache.spec.block_size
        # [sampled rows of the latest launched step] int64 on the device: per row, the index
        # (in that step's sampled rows) of the row whose history it continues (itself but for
        # re-parented beam slots); None when that step expanded no beam
        self.last_parent_index: torch.Tensor | None = None
        self._stop_ids: dict[tuple[int, ...], np.ndarray] = {}
        self._columns = torch.arange(0, device=device)  # 0, 1, ... (grown as tables widen)
        if device.type == "cuda":  # per sampled row: in, 4 + EOS ids / W (+ padding); out,
            # (2K + 3W) / W = 9 with two EOS ids (more grow the buffers once)
            self._inputs = StepBuffers(8 * max_num_seqs)
            self._outputs = StepBuffers(9 * max_num_seqs)

    # ----------------------------------------------------------------- launch
    def sample(self, logits: torch.Tensor, sampled_rows: np.ndarray, beam_index: np.ndarray,
               scheduled_pos: np.ndarray, token_ids: torch.Tensor | None,
               eos_token_ids: tuple[int, ...]) -> tuple[torch.Tensor, BeamLaunch]:
        """Expand the searches whose slots are among a step's sampled rows.

        Args:
            logits: [num_sampled, V] of the sampled rows.
            sampled_rows: [num_sampled] int64 their InputBatch rows.
            beam_index: [b] int64 positions (in the sampled rows) of beam slots.
            scheduled_pos: [num_sampled] int64 each sampled row's position among the step's
                scheduled rows (-1: forked this step).
            token_ids: [num_sampled] int64 on the device, the other rows' sampled tokens: the
                slots' are written here; None when every sampled row is a beam slot.
            eos_token_ids: the model's EOS ids.
        Returns:
            (the token ids of every sampled row: token_ids, or a new tensor when it was None;
             the launch).
        """
        batch = self.batch
        # the slots of each search, in slot order (the scheduler keeps them so: then this
        # sort is the identity)
        beam_rows = sampled_rows[beam_index]
        order = np.lexsort((batch.beam_slot[beam_rows], batch.beam_search[beam_rows]))
        index, beam_rows = beam_index[order], beam_rows[order]
        keys = batch.beam_search[beam_rows]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        widths = np.diff(np.r_[starts, len(keys)])
        assert (batch.beam_slot[beam_rows] == np.arange(len(keys)) - np.repeat(starts, widths)
                ).all(), f"beam slots sampled: {batch.beam_slot[beam_rows].tolist()}"
        assert (widths == batch.beam_width[beam_rows[starts]]).all(), (
            f"{widths.tolist()} slots of searches of widths "
            f"{batch.beam_width[beam_rows[starts]].tolist()} sampled")
        stops = batch.beam_stops[beam_rows[starts]]
        # K of each search (`pagedrt.core.beam.num_beam_candidates`)
        num_candidates = np.maximum(2, 1 + len(eos_token_ids) * stops) * widths
        if self.device.type == "cuda":
            self._inputs.next_step()
            self._outputs.next_step()
        num_sampled = len(sampled_rows)
        parent_index = None
        launched = []
        for width, k in sorted(set(zip(widths.tolist(), num_candidates.tolist()))):
            member = (widths == width) & (num_candidates == k)
            group_index = index[starts[member][:, None] + np.arange(width)]  # [G, W]
            # the common decode step: one bucket, all sampled rows, in order
            whole = group_index.size == num_sampled and (
                group_index.ravel() == np.arange(num_sampled)).all()
            if not whole and token_ids is None:
                token_ids = torch.zeros(num_sampled, dtype=torch.int64, device=self.device)
            if not whole and parent_index is None:
                parent_index = torch.arange(num_sampled, device=self.device)
            bucket, token_ids, parent_index = self._expand(
                logits, sampled_rows, width, k, group_index, stops[member], eos_token_ids,
                scheduled_pos, token_ids, parent_index, whole)
            launched.append(bucket)
        self.last_parent_index = parent_index
        return token_ids, BeamLaunch(launched)

    def _stop_table(self, eos: tuple[int, ...], stops: np.ndarray) -> np.ndarray | None:
        """[G, E] int64 each search's EOS ids (-1 for one that ignores EOS), or None when
        none of them stops at EOS."""
        if not len(eos) or not stops.any():
            return None
        row = self._stop_ids.get(eos)
        if row is None:
            row = self._stop_ids[eos] = np.array(eos, dtype=np.int64)
        return np.where(stops[:, None], row, -1)

    def _expand(self, logits, sampled_rows, width, k, index, stops, eos, scheduled_pos,
                token_ids, parent_index, whole: bool
                ) -> tuple[_Bucket, torch.Tensor, torch.Tensor]:
        """Expand the searches of one (W, K): index [G, W] their slots' sampled positions,
        stops [G] True where EOS ends a beam; whole: index is every sampled row in order.
        Writes the slots' tokens into token_ids and their parents' sampled positions into
        parent_index ([num_sampled] int64 on the device; made here when `whole`). Returns
        (the bucket, token_ids, parent_index)."""
        batch, bs = self.batch, self.block_size
        num_groups = len(index)
        rows = sampled_rows[index]
        num_tokens = batch.num_tokens[rows[:, 0]]  # before this step's token is appended
        # partial-block copies: searches whose slots all ran in this step (not just forked)
        # and whose next token goes into a partly filled block: that block is each slot's
        # own (its table entry is not re-parented on the device), so its id is the row's
        copy = np.flatnonzero((scheduled_pos[index] >= 0).all(axis=1) & (num_tokens % bs != 0))
        dst_blocks = batch.block_table[rows[copy], (num_tokens[copy] // bs)[:, None]]
        stop_table = self._stop_table(eos, stops)
        kernel = self.use_kernel and uses_triton(self.backend, logits)
        parts = [index.ravel(), rows.ravel(), dst_blocks.ravel()]
        if kernel:  # each search's row among the copied ones, or -1
            copy_of = np.full(num_groups, -1, dtype=np.int64)
            copy_of[copy] = np.arange(len(copy))
            parts.append(copy_of)
        elif len(copy) < num_groups:
            parts.append(copy)
        if stop_table is not None:
            parts.append(stop_table.ravel())
        # every part starts 16-byte aligned (at an even offset): the kernel is compiled for
        # aligned pointers once, not again mid-run for an odd offset
        padded = [x for p in parts for x in ((p, _PAD) if len(p) % 2 else (p,))]
        flat = torch.from_numpy(np.concatenate(padded))
        if self.device.type == "cuda":  # (pinned: a pageable copy waits for the stream)
            staged = self._inputs.take(len(flat))
            staged.copy_(flat)
            flat = staged.to(self.device, non_blocking=True)
        pieces = torch.split(flat, [len(p) for p in padded])
        index_t, rows_t, dst_t, *rest = [t for t, p in zip(pieces, padded) if p is not _PAD]
        copy_t = rest.pop(0) if kernel or len(copy) < num_groups else None
        stop_t = rest.pop(0).view(num_groups, -1) if stop_table is not None else None
        index_t, dst_t = index_t.view(num_groups, width), dst_t.view(len(copy), width)
        scores = batch.beam_scores.index_select(0, rows_t)
        slot_logits = logits if whole else logits.index_select(0, index_t.view(-1))
        if kernel:  # the candidates in two kernels, the rest in one
            from pagedrt.ops.beam_topk_triton import beam_top_candidates_triton
            from pagedrt.ops.beam_triton import beam_choose_triton  # (triton is optional)

            values, flat = beam_top_candidates_triton(slot_logits, scores, width, k)

            if whole:
                token_ids = torch.empty(len(sampled_rows), dtype=torch.int64,
                                        device=self.device)
                parent_index = torch.empty_like(token_ids)
            packed, src_t = beam_choose_triton(
                values, flat, logits.shape[1], stop_t, index_t, rows_t.view(num_groups, width),
                copy_t, dst_t, token_ids, batch.beam_scores, parent_index)
        else:
            values, flat = top_candidates(slot_logits, scores, width, k)
            out = choose_slots(values, flat, logits.shape[1], width, stop_t)
            batch.beam_scores.index_copy_(0, rows_t, out.slot_scores.view(-1))
            parents = index_t.gather(1, out.slot_parents).view(-1)  # as sampled positions
            if whole:
                token_ids, parent_index = out.slot_tokens.view(-1), parents
            else:
                token_ids.index_copy_(0, index_t.view(-1), out.slot_tokens.view(-1))
                parent_index.index_copy_(0, index_t.view(-1), parents)
            if len(copy):
                src_t = dst_t.gather(1, out.slot_parents if copy_t is None
                                     else out.slot_parents.index_select(0, copy_t))
            # values (as int32 bits, widened), flat indices, the slots' choices
            packed = torch.cat([values.view(torch.int32), flat, out.slot_candidates,
                                out.slot_parents, out.slot_tokens], dim=1)
        if len(copy):
            self.kv_cache.gather_copy_blocks(src_t.view(-1), dst_t.view(-1))
        if self.device.type == "cuda":  # one copy to the host as the step ends (fetch waits)
            host = self._outputs.take(packed.numel()).view(packed.shape)
            host.copy_(packed, non_blocking=True)
            packed = host
        names = batch.beam_search_ids
        bucket = _Bucket([names[key] for key in batch.beam_search[rows[:, 0]].tolist()], width,
                         k, logits.shape[1], rows, batch.epoch[rows].copy(), num_tokens, packed)
        return bucket, token_ids, parent_index

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
            [positions of the slots to patch, their index in that step's sampled rows, the
             number of leading table entries to take from the parent] and, unless every row
             that step sampled is scheduled now at the same position (a plain decode step),
             [position in that step's sampled rows -> scheduled position
             ([num_last_sampled])]; or None.
        """
        if self.last_parent_index is None or not len(pend):
            return None
        slots = pend[self.batch.is_beam[rows[pend]]]
        num_blocks = starts[slots] // self.block_size  # the full blocks of the history
        slots, num_blocks = slots[num_blocks > 0], num_blocks[num_blocks > 0]
        if not len(slots):
            return None
        pending = self.batch.pending[rows]
        patch = [slots, pending[slots], num_blocks]
        if len(pend) != num_last_sampled or (pending[pend] != pend).any():
            scheduled_of = np.zeros(num_last_sampled, dtype=np.int64)
            scheduled_of[pending[pend]] = pend
            patch.append(scheduled_of)
        return patch

    def apply_table_patch(self, block_tables: torch.Tensor, patch: list[torch.Tensor]) -> None:
        """Each patched slot's first entries become its parent's (`table_patch`, on the
        device; 5 or 6 tensor ops). block_tables: [n, width] int32, changed in place."""
        slots, sampled, num_blocks, *scheduled_of = patch
        parents = self.last_parent_index.index_select(0, sampled)
        if scheduled_of:
            parents = scheduled_of[0].index_select(0, parents)
        width = block_tables.shape[1]
        if self._columns.numel() < width or self._columns.device != block_tables.device:
            self._columns = torch.arange(2 * width, device=block_tables.device)
        take = self._columns[:width] < num_blocks.unsqueeze(1)  # [m, width]
        # entry (i, j) of the new tables is entry j of row source[i, j]
        source = torch.where(take, parents.unsqueeze(1), slots.unsqueeze(1))
        block_tables.index_copy_(0, slots, block_tables.gather(0, source))

    # ----------------------------------------------------------------- results
    def results(self, launch: BeamLaunch) -> list[BeamStepResult]:
        """The step's candidates, per (W, K) (its launch is done); re-parents the host copies
        of the slots' rows (unless a row changed hands since: the search was dropped)."""
        out = []
        batch, bs = self.batch, self.block_size
        for b in launch.buckets:
            k, w, vocab = b.num_candidates, b.width, b.vocab_size
            packed = b.out.numpy() if b.out.device.type == "cpu" else b.out.cpu().numpy()
            flat = packed[:, k:2 * k]
            beams = flat // vocab
            choice = packed[:, 2 * k:].copy()  # (not a view of a buffer used again)
            parents = choice[:, w:2 * w]
            out.append(BeamStepResult(
                b.group_ids, packed[:, :k].astype(np.int32).view(np.float32), beams,
                flat - beams * vocab, choice[:, :w], parents, choice[:, 2 * w:]))
            # the moved slots of searches whose rows are still theirs
            moved = (parents != np.arange(w)) & (
                batch.epoch[b.slot_rows] == b.slot_epochs).all(axis=1, keepdims=True)
            if not moved.any():
                continue
            groups, slots = np.nonzero(moved)
            num_tokens = b.num_tokens[groups]
            batch.reparent_rows(b.slot_rows[groups, slots],
                                b.slot_rows[groups, parents[groups, slots]], num_tokens,
                                num_tokens // bs)
        return out
