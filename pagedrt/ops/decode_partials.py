"""The split-K decode attention's partitions, uncombined: what `paged_attention_decode_triton`
hands back with `partials=True` to an O projection that combines them itself
(pagedrt/ops/attn_o_triton.py; docs/design.md, "Small-batch decode")."""

from __future__ import annotations

from typing import NamedTuple

import torch


class DecodePartials(NamedTuple):
    """part_out: [num_seqs, num_heads, num_splits, head_dim] fp32, each partition's output
    normalised over its own tokens (0 for an empty partition); part_lse: [num_seqs,
    num_heads, num_splits] fp32, each partition's log-sum-exp of the scaled scores in the
    log2 domain (-inf for an empty one); num_splits: the launch's partitions per sequence;
    dtype: the query's dtype, which the combined output takes."""

    part_out: torch.Tensor
    part_lse: torch.Tensor
    num_splits: int
    dtype: torch.dtype
