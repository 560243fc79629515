"""The L2 weight prefetch's requests (`triton_utils.prefetch_chunks`, behind
PAGEDRT_L2_PREFETCH=1) under the interpreter: the prefetch itself is inline PTX the interpreter
cannot run, so the tests check the arithmetic that places its requests."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from pagedrt.ops.triton_utils import prefetch_chunks


@triton.jit
def _chunks_kernel(offset_ptr, size_ptr, first_row, num_rows, stride_row, col0, ncols,
                   ELEM: tl.constexpr, NROWS: tl.constexpr, SLOTS: tl.constexpr):
    offset, size = prefetch_chunks(first_row, num_rows, stride_row, col0, ncols, ELEM, NROWS,
                                   SLOTS)
    tl.store(offset_ptr + tl.arange(0, SLOTS), offset)
    tl.store(size_ptr + tl.arange(0, SLOTS), size)


# (first_row, num_rows, stride_row, col0, ncols, elem, rows per program, slots): Qwen2-0.5B's
# down projection past a 1,024-column pre-load, a tile past the last row, an 8-128-row
# matmul's split-K range, a row shorter than its slots, fp32
CASES = [(8, 896, 4864, 1024, 3840, 2, 4, 128), (888, 896, 4864, 0, 4864, 2, 16, 128),
         (64, 1152, 896, 256, 256, 2, 64, 128), (0, 10, 64, 0, 8, 2, 2, 128),
         (3, 5, 40, 8, 32, 4, 4, 32)]


@pytest.mark.parametrize("case", CASES)
def test_prefetch_requests_cover_each_row_in_16_byte_units(case):
    first, num_rows, stride, col0, ncols, elem, nrows, slots = case
    offset = torch.empty(slots, dtype=torch.int64)
    size = torch.empty(slots, dtype=torch.int32)
    _chunks_kernel[(1,)](offset, size, first, num_rows, stride, col0, ncols, ELEM=elem,
                         NROWS=nrows, SLOTS=slots)
    assert (size > 0).all() and (size % 16 == 0).all() and (offset % 16 == 0).all()
    assert (offset >= 0).all() and (offset + size <= num_rows * stride * elem).all()
    rows = sorted({min(first + r, num_rows - 1) for r in range(nrows)})
    covered = {r: set() for r in rows}
    for o, n in zip(offset.tolist(), size.tolist(), strict=True):
        row, start = divmod(o - col0 * elem, stride * elem)
        assert row in covered, f"request at byte {o} is in row {row}, not one of {rows}"
        assert 0 <= start and start + n <= ncols * elem, "a request outside the columns"
        covered[row].update(range(start // 16, (start + n) // 16))
    for row, units in covered.items():
        assert units == set(range(ncols * elem // 16)), f"row {row} not covered exactly"


@pytest.mark.parametrize("case", [(1088, 1152, 896, 896, 0, 2, 64, 128),
                                  (0, 4, 32, 112, -80, 2, 16, 128)],
                         ids=["empty_split_qwen_qkv", "split_past_k"])
def test_an_empty_range_asks_only_for_row_starts_inside_the_matrix(case):
    """ncols <= 0 (an empty split-K range; the matmul skips it, this is the fallback): every
    request is the first 16 bytes of one of the program's rows, never past the matrix's end
    (found by review: col0 past K pointed the last row's requests past W's allocation)."""
    first, num_rows, stride, col0, ncols, elem, nrows, slots = case
    offset = torch.empty(slots, dtype=torch.int64)
    size = torch.empty(slots, dtype=torch.int32)
    _chunks_kernel[(1,)](offset, size, first, num_rows, stride, col0, ncols, ELEM=elem,
                         NROWS=nrows, SLOTS=slots)
    assert (size == 16).all()
    starts = {min(first + r, num_rows - 1) * stride * elem for r in range(nrows)}
    assert set(offset.tolist()) <= starts
