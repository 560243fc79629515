"""Beam search's choice among a step's candidates in one Triton kernel (docs/design.md, "Beam
search"): what `pagedrt.engine.beam_search.expand_beams` does after its top-k, and what the
beam runner then writes with it, for every search at once. One program per search.

The torch version (`expand_beams` and `BeamRunner._expand`) takes about 20 small tensor ops
for this, each a kernel launch of some microseconds of host time per step; this is one. Both
apply the same rules and write the same values (`tests/test_beam_triton.py` compares them
under Triton's CPU interpreter).

Per search g, with its K candidates best first (value, flat index = beam * V + token):

    running    the first W candidates whose token is not one of the search's EOS ids
    slots      a parent's best running child keeps the parent's slot; the other running
               children take, in order, the slots that are nobody's parent, lowest first
    per slot   its candidate, parent slot, token and value

and it writes: the packed row the host reads (values as int32 bits, flat indices, then per slot
the candidate, parent and token), each slot's token into the step's token ids and value into
the beam scores (by InputBatch row), each slot's parent's position in the sampled rows, and
for the searches whose partial blocks are copied, the source block of each slot's copy (the
destination block of its parent).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.triton_utils import next_pow2


@triton.jit
def _beam_choose_kernel(
    values_ptr, flat_ptr, stop_ptr, index_ptr, rows_ptr, copy_of_ptr, dst_ptr,
    packed_ptr, token_ptr, score_ptr, parent_ptr, src_ptr,
    vocab,
    K: tl.constexpr, W: tl.constexpr, E: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, KP)  # candidates
    c_ok = c < K
    val = tl.load(values_ptr + g * K + c, mask=c_ok, other=0.0)
    flat = tl.load(flat_ptr + g * K + c, mask=c_ok, other=0)
    beam = flat // vocab
    tok = flat - beam * vocab
    run = c_ok.to(tl.int32)  # 0/1 flags throughout
    for e in tl.static_range(E):
        run = run * (tok != tl.load(stop_ptr + g * E + e)).to(tl.int32)
    rank = tl.cumsum(run, axis=0) - 1  # among the running candidates
    run = run * (rank < W).to(tl.int32)
    # a later child: an earlier running candidate has the same parent
    earlier = ((beam[:, None] == beam[None, :]).to(tl.int32) * run[None, :]
               * (c[None, :] < c[:, None]).to(tl.int32))  # [KP, KP]
    later = (tl.sum(earlier, axis=1) > 0).to(tl.int32) * run
    s = tl.arange(0, WP)  # slots
    s_ok = s < W
    used = tl.sum((beam[None, :] == s[:, None]).to(tl.int32) * run[None, :], axis=1) > 0
    free = (s_ok & (used == 0)).to(tl.int32)
    free_rank = tl.cumsum(free, axis=0) - 1
    nth = tl.cumsum(later, axis=0) - 1  # a later child's rank among the later children
    take = (free[None, :] * later[:, None]
            * (free_rank[None, :] == nth[:, None]).to(tl.int32))  # [KP, WP]
    free_slot = tl.sum(take * s[None, :], axis=1)
    slot = tl.where(later > 0, free_slot, beam)
    hit = (slot[None, :] == s[:, None]).to(tl.int32) * run[None, :]  # [WP, KP], one per slot
    cand = tl.sum(hit * c[None, :], axis=1)
    parent = tl.sum(hit * beam[None, :], axis=1)
    token = tl.sum(hit * tok[None, :], axis=1)
    score = tl.sum(tl.where(hit > 0, val[None, :], 0.0), axis=1)
    # the packed row: [values as int32 bits | flat | candidate | parent | token]
    row = packed_ptr + g * (2 * K + 3 * W)
    tl.store(row + c, val.to(tl.int32, bitcast=True).to(tl.int64), mask=c_ok)
    tl.store(row + K + c, flat, mask=c_ok)
    tl.store(row + 2 * K + s, cand.to(tl.int64), mask=s_ok)
    tl.store(row + 2 * K + W + s, parent.to(tl.int64), mask=s_ok)
    tl.store(row + 2 * K + 2 * W + s, token.to(tl.int64), mask=s_ok)
    index = tl.load(index_ptr + g * W + s, mask=s_ok, other=0)
    tl.store(token_ptr + index, token.to(tl.int64), mask=s_ok)
    tl.store(score_ptr + tl.load(rows_ptr + g * W + s, mask=s_ok, other=0), score, mask=s_ok)
    parent_index = tl.load(index_ptr + g * W + parent, mask=s_ok, other=0)
    tl.store(parent_ptr + index, parent_index, mask=s_ok)
    copy_row = tl.load(copy_of_ptr + g)
    if copy_row >= 0:
        source = tl.load(dst_ptr + copy_row * W + parent, mask=s_ok, other=0)
        tl.store(src_ptr + copy_row * W + s, source, mask=s_ok)


def beam_choose_triton(values: torch.Tensor, flat: torch.Tensor, vocab_size: int,
                       stop_token_ids: torch.Tensor | None, index: torch.Tensor,
                       rows: torch.Tensor, copy_of: torch.Tensor, dst_blocks: torch.Tensor,
                       token_ids: torch.Tensor, beam_scores: torch.Tensor,
                       parent_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The choice of G searches of W beams among their K candidates, and its writes (see the
    module docstring); no host sync.

    Args:
        values: [G, K] float32, flat: [G, K] int64: the top-k of each search's W x V
            cumulative scores (best first) and their indices (beam * vocab_size + token).
        stop_token_ids: [G, E] int64 each search's EOS ids (-1: none), or None (no search
            ends at EOS).
        index: [G, W] int64 each slot's position in the step's sampled rows.
        rows: [G, W] int64 each slot's InputBatch row.
        copy_of: [G] int64 each search's row in dst_blocks, or -1 (its blocks are not copied).
        dst_blocks: [C, W] int64 the partial block of each slot of the copied searches.
        token_ids, parent_index: [num_sampled] int64, beam_scores: [num_rows] float32: written
            at the slots' positions / rows.

    Returns:
        (packed [G, 2K + 3W] int64: per search the values' float32 bits as int32, the flat
         indices, then per slot its candidate, parent slot and token; src_blocks [C, W]
         int64: the source block of each copy, the parent slot's entry of dst_blocks).

    Raises:
        ValueError: shapes, dtypes or devices that do not fit the contract.
    """
    num_groups, k = values.shape
    width = index.shape[1]
    device = values.device
    for name, t, shape, dtype in (("values", values, (num_groups, k), torch.float32),
                                  ("flat", flat, (num_groups, k), torch.int64),
                                  ("index", index, (num_groups, width), torch.int64),
                                  ("rows", rows, (num_groups, width), torch.int64),
                                  ("copy_of", copy_of, (num_groups,), torch.int64)):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
            raise ValueError(f"{name} is {tuple(t.shape)} {t.dtype} on {t.device}; expected "
                             f"{shape} {dtype} on {device}")
    if not k >= width >= 1 or dst_blocks.dim() != 2 or dst_blocks.shape[1] != width:
        raise ValueError(f"K={k}, W={width}, dst_blocks {tuple(dst_blocks.shape)}: need "
                         f"K >= W >= 1 and dst_blocks [C, W]")
    num_stops = 0 if stop_token_ids is None else stop_token_ids.shape[1]
    if stop_token_ids is None:
        stop_token_ids = flat  # (never read: E = 0)
    packed = torch.empty(num_groups, 2 * k + 3 * width, dtype=torch.int64, device=device)
    src_blocks = torch.empty_like(dst_blocks)
    if num_groups:
        _beam_choose_kernel[(num_groups,)](
            values.contiguous(), flat.contiguous(), stop_token_ids.contiguous(),
            index.contiguous(), rows.contiguous(), copy_of, dst_blocks.contiguous(),
            packed, token_ids, beam_scores, parent_index, src_blocks, vocab_size,
            K=k, W=width, E=num_stops, KP=next_pow2(max(k, 2)), WP=next_pow2(max(width, 2)),
            num_warps=1)
    return packed, src_blocks
