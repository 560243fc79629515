"""The split-K decode attention's partial results, handed from the attention to the O
projection that combines them in its prologue (docs/design.md, "Small-batch decode")."""

from __future__ import annotations

from typing import NamedTuple

import torch


class DecodePartials(NamedTuple):
    """Decode attention split into num_splits partitions per sequence, not yet combined.

    Attributes:
        part_out: [num_seqs, num_heads, num_splits, head_dim] float32, each partition's output
            normalised over its own keys.
        part_lse: [num_seqs, num_heads, num_splits] float32, each partition's log-sum-exp of
            its scores in the log2 domain; -inf for an empty partition.
        num_splits: partitions per sequence (> 1).
        dtype: the attention output's dtype (the query's), which the combine rounds to.
    """

    part_out: torch.Tensor
    part_lse: torch.Tensor
    num_splits: int
    dtype: torch.dtype
