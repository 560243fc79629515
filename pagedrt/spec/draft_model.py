"""The draft model of speculative decoding ("method": "draft_model"): a smaller model with the
target's vocabulary proposes k tokens greedily, on the device side, right before the step that
verifies them (pagedrt/engine/spec_runner.py, `SpecRunner.write_drafts`).

Its KV cache is its own (the draft's layers, heads and head_dim; `KVCache` built from the
draft's `KVCacheSpec`) with as many blocks as the target's, and a sequence's draft K/V sit in
the blocks of the sequence's own block table: a block id names a slot range in both caches.
So the draft needs no allocator of its own, never runs short when the target does not, and its
blocks are freed with the sequence's. What the draft has computed is tracked per sequence:

    tokens:       0 ............................. T-1   (all known; x = token T-1)
    draft KV:     [0, computed) valid
    a proposal:   1. one extend pass over [computed, T): the draft's logits at x give d_1
                  2. k - 1 decode passes: d_t at position T - 1 + t gives d_(t+1)
                  computed = T (d_1 .. d_(k-1) are written but not counted: the next
                  proposal recomputes the accepted ones with the target's token after them)

The target's step allocated slots for positions up to T - 1 + k, so every draft write lands in
the sequence's own blocks. A sequence the draft has not seen (new, resumed after a
preemption, a forked sample) starts from computed = 0: the draft rewrites its whole context,
prefix-cache hits included (blocks shared with other sequences get the same values). Block
copies of copy-on-write are applied to the draft's cache too; swapped-out sequences are
forgotten (the draft's cache has no CPU pool) and start again from 0.

Drafts are greedy (the draft's argmax), so the rejection sampler's draft distribution is
one-hot (pagedrt/spec/rejection_sampler.py): sampling stays exact, and a draft equal to the
target is accepted every time under greedy decoding.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedrt.engine.input_batch import InputBatch
from pagedrt.kv.kv_cache import KVCache
from pagedrt.kv.kv_cache_manager import PendingCopies
from pagedrt.ops.attention import AttentionMetadata


class DraftModelProposer:
    """Runs the draft model on the device side (see the module docstring).

    Args:
        model: the draft model (a `LlamaForCausalLM`), on the target's device and dtype.
        kv_cache: its KV cache, with the target's number of blocks and block size.
        device: where both run.
        backend: attention backend ("auto", "torch", "triton").
    """

    def __init__(self, model, kv_cache: KVCache, device, backend: str) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = torch.device(device)
        self.backend = backend
        self.block_size = kv_cache.spec.block_size
        self.num_computed: dict[str, int] = {}  # req_id -> draft K/V valid for [0, that)

    def forget(self, req_ids: list[str]) -> None:
        """Sequences whose rows are dropped (finished, preempted): their draft K/V is gone."""
        for req_id in req_ids:
            self.num_computed.pop(req_id, None)

    def apply_copies(self, copies: PendingCopies) -> None:
        """Copy-on-write copies of the target's blocks, made in the draft's cache too (swaps
        are not: swapped sequences were forgotten)."""
        if copies.copy:
            self.kv_cache.apply(PendingCopies(copy=list(copies.copy)))

    def _meta(self, rows: np.ndarray, batch: InputBatch, starts: np.ndarray,
              ends: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Inputs of one pass: row i computes its tokens at positions [starts[i], ends[i])
        (input ids from the row, which holds the drafts written so far)."""
        bs = self.block_size
        q = ends - starts
        cu = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(q, out=cu[1:])
        which = np.repeat(np.arange(len(rows)), q)
        positions = np.arange(int(cu[-1])) - cu[which] + starts[which]
        width = max(int(batch.num_blocks[rows].max()), 1)
        tables = batch.block_table[rows, :width]
        slots = tables[which, positions // bs].astype(np.int64) * bs + positions % bs
        ids = batch.token_ids[rows[which], positions].astype(np.int64)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slots).to(dev),
            block_tables=torch.from_numpy(np.ascontiguousarray(tables)).to(dev),
            seq_lens=torch.from_numpy(ends.astype(np.int32)).to(dev),
            cu_seqlens_q=torch.from_numpy(cu.astype(np.int32)).to(dev),
            max_query_len=int(q.max()), max_seq_len=int(ends.max()), backend=self.backend)
        return torch.from_numpy(ids).to(dev), torch.from_numpy(positions).to(dev), meta

    @torch.inference_mode()
    def propose(self, batch: InputBatch, rows: np.ndarray, num_drafts: np.ndarray,
                req_ids: list[str]) -> list[list[int]]:
        """Greedy drafts for rows whose tokens are all known.

        Args:
            batch: the target's rows (token ids and block tables).
            rows: [S] int64 InputBatch rows.
            num_drafts: [S] int64, drafts wanted per row (>= 1).
            req_ids: the rows' sequence ids.
        Returns:
            S lists of num_drafts[s] token ids (the caller writes them into the rows).
        """
        ends = batch.num_tokens[rows].astype(np.int64)  # T per row
        starts = np.asarray([min(self.num_computed.get(r, 0), int(t) - 1)
                             for r, t in zip(req_ids, ends)], dtype=np.int64)
        ids, positions, meta = self._meta(rows, batch, starts, ends)
        hidden = self.model(ids, positions, self.kv_cache.layers, meta)
        last = torch.from_numpy(np.cumsum(ends - starts) - 1).to(self.device)
        token = self.model.compute_logits(hidden[last]).argmax(dim=-1)  # [S] d_1
        drafts = [token]
        for t in range(1, int(num_drafts.max())):
            # d_t at position T - 1 + t (all rows run; rows wanting fewer drafts ignore theirs)
            n = len(rows)
            pos = ends - 1 + t
            bs = self.block_size
            width = max(int(batch.num_blocks[rows].max()), 1)
            tables = batch.block_table[rows, :width]
            cols = np.minimum(pos // bs, width - 1)
            slots = tables[np.arange(n), cols].astype(np.int64) * bs + pos % bs
            # a row wanting fewer drafts may have no block for this position: no write
            slots = np.where(t < num_drafts, slots, -1)
            dev = self.device
            meta = AttentionMetadata(
                slot_mapping=torch.from_numpy(slots).to(dev),
                block_tables=torch.from_numpy(np.ascontiguousarray(tables)).to(dev),
                seq_lens=torch.from_numpy(np.where(t < num_drafts, pos + 1, ends)
                                          .astype(np.int32)).to(dev),
                cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32, device=dev),
                max_query_len=1, max_seq_len=int(pos.max()) + 1, backend=self.backend)
            hidden = self.model(token, torch.from_numpy(pos).to(dev), self.kv_cache.layers,
                                meta)
            token = self.model.compute_logits(hidden).argmax(dim=-1)
            drafts.append(token)
        for req_id, t in zip(req_ids, ends.tolist()):
            self.num_computed[req_id] = t
        table = torch.stack(drafts, dim=1).tolist()  # [S, max drafts]; one host sync
        return [table[s][: int(num_drafts[s])] for s in range(len(rows))]


def load_draft_model(model, dtype: torch.dtype, device: torch.device, target,
                     max_model_len: int):
    """The draft model of speculative decoding: a path (loaded in `dtype` on `device`) or a
    LoadedModel (used as it is). Raises ValueError when the path is neither a .gguf file nor a
    model folder (naming speculative_config, whose "model" it is), when its vocabulary size
    differs from the target's (`target`: the target's ModelConfig; drafts are token ids) or
    it cannot hold max_model_len positions."""
    from pagedrt.models.loader import load_model, model_path_kind

    if isinstance(model, str):
        path, kind = model_path_kind(model)
        if kind is None:
            raise ValueError(
                f"cannot load the draft model {model!r} of speculative_config (resolved to "
                f"{path!r}): its \"model\" must be a .gguf file or a Hugging Face folder with "
                "config.json and *.safetensors, with the target's vocabulary")
    draft = load_model(model, dtype, device) if isinstance(model, str) else model
    name = model if isinstance(model, str) else draft.model_path
    mc = draft.model_config
    if mc.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft model {name!r} has vocab_size={mc.vocab_size}, the target "
            f"{target.vocab_size}; speculative decoding needs the same tokenizer")
    if mc.max_position_embeddings < max_model_len:
        raise ValueError(
            f"draft model {name!r} has max_position_embeddings={mc.max_position_embeddings} < "
            f"max_model_len={max_model_len}; lower max_model_len")
    return draft
