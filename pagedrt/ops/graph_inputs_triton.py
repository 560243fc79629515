"""The kernels over a staged decode step: the scatter into the CUDA graphs' static buffers, and
a multi-step decode's move to its next pass; the layout, its host side and the torch
references are in graph_inputs.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["table_stride"])
def _scatter_decode_inputs_kernel(staged_ptr, staged32_ptr, last_tokens_ptr, input_ids_ptr,
                                  positions_ptr, slot_mapping_ptr, seq_lens_ptr,
                                  block_tables_ptr, table_stride, BLOCK_W: tl.constexpr):
    """One program per graph row i: row i of the staged step, or padding (position 0, slot
    -1: nothing written; seq_len 1) for i >= n."""
    i = tl.program_id(0)
    n = tl.load(staged_ptr)
    width = tl.load(staged_ptr + 1)
    valid = i < n
    base = 2 + i
    token = tl.load(staged_ptr + base, mask=valid, other=0)
    position = tl.load(staged_ptr + base + n, mask=valid, other=0)
    slot = tl.load(staged_ptr + base + 2 * n, mask=valid, other=-1)
    src = tl.load(staged_ptr + base + 3 * n, mask=valid, other=-1)
    pending = tl.load(last_tokens_ptr + tl.maximum(src, 0), mask=src >= 0, other=0)
    tl.store(input_ids_ptr + i, tl.where(src >= 0, pending, token))
    tl.store(positions_ptr + i, position)
    tl.store(slot_mapping_ptr + i, slot)
    small = 2 * (2 + 4 * n)  # int32 index of seq_lens
    seq_len = tl.load(staged32_ptr + small + i, mask=valid, other=1)
    tl.store(seq_lens_ptr + i, seq_len)
    row = staged32_ptr + small + n + i * width
    out = block_tables_ptr + i.to(tl.int64) * table_stride
    num = tl.where(valid, width, 0)
    for start in range(0, num, BLOCK_W):
        cols = start + tl.arange(0, BLOCK_W)
        tl.store(out + cols, tl.load(row + cols, mask=cols < num), mask=cols < num)


def scatter_decode_inputs(staged: torch.Tensor, last_tokens: torch.Tensor,
                          input_ids: torch.Tensor, positions: torch.Tensor,
                          slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                          block_tables: torch.Tensor, num_rows: int) -> None:
    """Write the staged step into the first `num_rows` rows of the static buffers (one launch,
    capturable: it reads n and width from `staged` on the device).

    Args:
        staged: [size] int64, the layout of graph_inputs.py (n <= num_rows).
        last_tokens: [m] int64, the previous step's sampled ids (pending_src indexes it).
        input_ids, positions, slot_mapping: [>= num_rows] int64; seq_lens: [>= num_rows]
            int32; block_tables: [>= num_rows, max_blocks] int32 (width <= max_blocks),
            unit stride in its last dimension. Written in place.
        num_rows: the graph's batch size.
    """
    _scatter_decode_inputs_kernel[(num_rows,)](
        staged, staged.view(torch.int32), last_tokens, input_ids, positions, slot_mapping,
        seq_lens, block_tables, block_tables.stride(0), BLOCK_W=128, num_warps=1)


@triton.jit(do_not_specialize=["n", "width"])
def _advance_decode_inputs_kernel(staged_ptr, staged32_ptr, last_tokens_ptr, tokens_ptr, n,
                                  width, BLOCK_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """Rows of BLOCK per program: position and seq_len + 1, the slot of the new position from
    the row's block table, the input id pending from last_tokens[row], which is copied to
    tokens[row]."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < n
    token = tl.load(last_tokens_ptr + rows, mask=mask)
    tl.store(tokens_ptr + rows, token, mask=mask)
    position = tl.load(staged_ptr + 2 + n + rows, mask=mask, other=0) + 1
    tl.store(staged_ptr + 2 + n + rows, position, mask=mask)
    tl.store(staged_ptr + 2 + 3 * n + rows, rows.to(tl.int64), mask=mask)
    small = 2 * (2 + 4 * n)  # int32 index of seq_lens
    seq_len = tl.load(staged32_ptr + small + rows, mask=mask, other=0) + 1
    tl.store(staged32_ptr + small + rows, seq_len, mask=mask)
    table = staged32_ptr + small + n + rows.to(tl.int64) * width
    block = tl.load(table + position // BLOCK_SIZE, mask=mask, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + position % BLOCK_SIZE
    tl.store(staged_ptr + 2 + 2 * n + rows, slot, mask=mask)


def advance_decode_inputs(staged: torch.Tensor, n: int, width: int, block_size: int,
                          last_tokens: torch.Tensor, tokens: torch.Tensor) -> None:
    """Move an n-row staged decode step on to a multi-step decode's next pass, in one launch
    (graph_inputs.advance_decode_inputs_reference is the same in torch ops).

    Args:
        staged: [size] int64, the layout of graph_inputs.py, with n rows and width table
            entries a row.
        n, width: those, as the host staged them.
        block_size: tokens per KV block.
        last_tokens: [>= n] int64, the pass's sampled ids (row i's at i).
        tokens: [n] int64, where those ids are copied (the pass's row of the multi-step
            plan's tokens).
    """
    _advance_decode_inputs_kernel[(triton.cdiv(n, 128),)](
        staged, staged.view(torch.int32), last_tokens, tokens, n, width,
        BLOCK_SIZE=block_size, BLOCK=128, num_warps=4)
