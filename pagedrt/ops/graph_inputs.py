"""A decode step's inputs, staged in one device buffer for a kernel captured in the CUDA graph
itself to scatter into the graph's static buffers (the kernel: graph_inputs_triton.py;
docs/design.md, "Decode inputs staged for the graphs").

Without it a decode step's replay costs, besides the step's one host-to-device copy, two
launches to read pending input ids from the previous step's samples and five copies plus up
to three fills into the static buffers: host time that the device waits for at small batches.
With it: the copy, into a buffer whose address the graph knows, and the replay.

Layout of `staged` ([size] int64, written by one host-to-device copy per step;
`stage_decode_inputs` builds it on the host):

    [n, width | input_ids [n] | positions [n] | slot_mapping [n] | pending_src [n]
     | int32 pairs: seq_lens [n], block_tables [n * width] row-major]

n: the step's rows (<= the graph's batch size, rows n.. are padding); width: block-table
entries per row. pending_src[i]: -1, or the row of `last_tokens` (the previous step's sampled
ids, copied there by the model runner) that holds row i's input id, still being sampled when
the step was prepared (async scheduling).
"""

from __future__ import annotations

import numpy as np
import torch

HEADER = 2  # n, width


def staged_size(num_rows: int, width: int) -> int:
    """int64 elements of a staged step of `num_rows` rows and `width` block-table entries."""
    return HEADER + 4 * num_rows + -(-(num_rows + num_rows * width) // 2)


def staged_input_ids(staged: torch.Tensor, n: int) -> torch.Tensor:
    """The input ids of an n-row step in `staged` ([n] int64 view)."""
    return staged[HEADER: HEADER + n]


def staged_decode_columns(staged: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """The input ids, positions, slot mapping and pending sources of an n-row step in `staged`
    ([n] int64 views each)."""
    return tuple(staged[HEADER + i * n: HEADER + (i + 1) * n] for i in range(4))


def staged_seq_lens(staged: torch.Tensor, n: int) -> torch.Tensor:
    """The seq_lens of an n-row step in `staged` ([n] int32 view)."""
    first = 2 * (HEADER + 4 * n)
    return staged.view(torch.int32)[first: first + n]


def staged_block_tables(staged: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """The block tables of an n-row step in `staged` ([n, width] int32 view)."""
    first = 2 * (HEADER + 4 * n) + n  # int32 index, after seq_lens
    return staged.view(torch.int32)[first: first + n * width].view(n, width)


def stage_decode_inputs(input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
                        pending_src: np.ndarray, seq_lens: np.ndarray,
                        block_tables: np.ndarray) -> np.ndarray:
    """The staged layout of the module docstring, on the host.

    Args:
        input_ids, positions, slot_mapping, pending_src: [n] int64 (pending_src -1 where the
            input id is known).
        seq_lens: [n] int (fits int32), tokens in each row's context after this step.
        block_tables: [n, width] int (fits int32).
    Returns:
        [staged_size(n, width)] int64.
    """
    n, width = block_tables.shape
    small = np.zeros(2 * (staged_size(n, width) - HEADER - 4 * n), dtype=np.int32)
    small[:n] = seq_lens
    small[n: n + n * width] = block_tables.ravel()
    return np.concatenate([np.array([n, width], dtype=np.int64), input_ids, positions,
                           slot_mapping, pending_src, small.view(np.int64)])


def slots_of(block_tables: torch.Tensor, positions: torch.Tensor,
             block_size: int) -> torch.Tensor:
    """[n] int64 KV slots of `positions` ([n] int64, one a row) in their rows of
    `block_tables` ([n, width] int)."""
    blocks = block_tables.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1)
    return blocks.to(torch.int64) * block_size + positions % block_size


def advance_staged_positions(staged: torch.Tensor, n: int, width: int,
                             block_size: int) -> None:
    """An n-row step in `staged` one position further on, in place: every row's position and
    seq_len + 1, its slot that of the new position (`slots_of`); input ids and pending
    sources untouched."""
    _, positions, slots, _ = staged_decode_columns(staged, n)
    positions.add_(1)
    staged_seq_lens(staged, n).add_(1)
    slots.copy_(slots_of(staged_block_tables(staged, n, width), positions, block_size))


def advance_decode_inputs_reference(staged: torch.Tensor, n: int, width: int,
                                    block_size: int, last_tokens: torch.Tensor,
                                    tokens: torch.Tensor) -> None:
    """A multi-step decode's next pass in `staged` (graph_inputs_triton.advance_decode_inputs
    in torch ops, its arguments; docs/design.md, "Multi-step decode"): the positions moved on
    (`advance_staged_positions`), every row's input id pending from last_tokens[row]
    (pending_src = row); last_tokens[:n] copied to `tokens`."""
    tokens.copy_(last_tokens[:n])
    advance_staged_positions(staged, n, width, block_size)
    staged_decode_columns(staged, n)[3].copy_(torch.arange(n, device=staged.device))


def scatter_decode_inputs_reference(staged: torch.Tensor, last_tokens: torch.Tensor,
                                    input_ids: torch.Tensor, positions: torch.Tensor,
                                    slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                                    block_tables: torch.Tensor, num_rows: int) -> None:
    """graph_inputs_triton.scatter_decode_inputs in torch ops (the tests' oracle), the
    same arguments."""
    n, width = (int(x) for x in staged[:HEADER].tolist())
    ids, pos, slots, src = staged[HEADER: HEADER + 4 * n].view(4, n)
    pending = src >= 0
    ids = torch.where(pending, last_tokens[src.clamp(min=0)], ids)
    input_ids[:n] = ids
    positions[:n] = pos
    slot_mapping[:n] = slots
    seq_lens[:n] = staged[HEADER + 4 * n:].view(torch.int32)[:n]
    block_tables[:n, :width] = staged_block_tables(staged, n, width)
    input_ids[n:num_rows] = 0
    positions[n:num_rows] = 0
    slot_mapping[n:num_rows] = -1
    seq_lens[n:num_rows] = 1
