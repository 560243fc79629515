"""The split-K reduce folded into the decode kernel (FUSED_REDUCE, switched on by
PAGEDRT_DECODE_FUSED_REDUCE=1) on CPU under TRITON_INTERPRET=1: against the torch reference and
against the two-kernel path (the partials combined by `_decode_reduce_kernel`), which it must
match bit for bit (the same partials, combined by the same `_combine_partials`).

The interpreter runs a launch's programs one at a time (for each (sequence, KV head), split 0
first and num_splits - 1 last), so these tests check the arithmetic, which program combines,
the arrival counters' lifetime (back to 0 after every launch; a launch of one split never
touches them; grown only outside graph capture) and that one kernel is launched instead of
two. What they cannot see is the memory ordering between programs that run at the same time:
tests/test_decode_codegen.py checks the compiled order of the partial stores, the barrier, the
acq_rel atomic and the L1-bypassing loads, and tests/gpu/test_decode_fused_reduce_gpu.py runs
the fused path on a GPU, repeatedly and in a CUDA graph.

Caches come from tests/test_attention_triton.py (`make_paged_kv`: NaN-filled, shuffled block
tables, NaN past each sequence's end) and tests/test_fp8_kv_kernels.py (`fp8_paged_kv`). Fresh
buffers hold NaN here (`nan_empty`): a program that combines before every partial is stored, or
an output row that no program writes, shows as NaN and not as a stale copy of an earlier
launch's values (the CPU allocator hands the same memory back).
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from test_attention_triton import assert_close, make_paged_kv
from test_fp8_kv_kernels import assert_close as assert_close_fp8
from test_fp8_kv_kernels import fp8_paged_kv

from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri
from pagedrt.ops import triton_utils

ENV = "PAGEDRT_DECODE_FUSED_REDUCE"
CPU = torch.device("cpu")
# 16-token tiles: every partition of a sequence up to 100 tokens long is a tile or a few, so 2
# and 3 splits give 2 and 3 non-empty partitions (the default BLOCK_N, 128 at head_dim 32, would
# leave every partition but the first empty at these lengths), and 8 splits of a sequence
# of at most 100 tokens leave at least one partition empty
SMALL_TILES = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
BLOCK_SIZE = 16
LENS = [1, BLOCK_SIZE, BLOCK_SIZE + 1, 2 * BLOCK_SIZE, 65, 100]


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty and torch.empty_like give floating-point tensors filled with NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: nan(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: nan(empty_like(*a, **k)))


@pytest.fixture
def reduce_launches(monkeypatch) -> list:
    """Records the grid of every `_decode_reduce_kernel` launch (the kernel still runs)."""
    grids = []
    kernel = tri._decode_reduce_kernel

    class Counting:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(tri, "_decode_reduce_kernel", Counting())
    return grids


@pytest.fixture
def combines(monkeypatch) -> list:
    """Counts the (sequence, query head) pairs `_combine_partials` combines (its row_mask's
    true entries; a call combines a block of pairs), from either kernel: the interpreter runs
    a kernel as Python, looking the helper up in the module at each call. In the interpreter's one-at-a-time order a program that combined too
    early would still be followed by the right one (each resets the counter, so every later
    program would combine again, the last one with every partial stored): a count of the
    combines is what shows it."""
    calls = []
    helper = tri._combine_partials

    def counting(*args):
        row_mask = args[3]  # an interpreter tensor: its values are a numpy array
        calls.extend([1] * int(row_mask.handle.data.sum()))
        return helper(*args)

    monkeypatch.setattr(tri, "_combine_partials", counting)
    return calls


@pytest.fixture
def decode(monkeypatch, nan_empty, reduce_launches, combines):
    """decode(fused, *args, **kwargs): `paged_attention_decode_triton` with the fused reduce
    switched on or off (the environment variable, read at the launch); checks after each
    launch that a split one launched the reduce kernel only when not fused, combined each
    (sequence, query head) once, and, when fused, left every counter at 0."""

    def run(fused: bool, *args, **kwargs):
        monkeypatch.setenv(ENV, "1" if fused else "0")
        before, combined_before = len(reduce_launches), len(combines)
        out = tri.paged_attention_decode_triton(*args, **kwargs)
        launched = len(reduce_launches) - before
        num_splits = kwargs.get("num_splits")
        if num_splits is not None and num_splits > 1:
            assert launched == (0 if fused else 1), f"{launched} reduce launches"
            num_seqs, num_heads, _ = out.shape
            assert len(combines) - combined_before == num_seqs * num_heads
        if fused and CPU in tri._REDUCE_COUNTERS:
            counters = tri._REDUCE_COUNTERS[CPU]
            assert counters.dtype == torch.int32
            assert counters.numel() >= tri.MIN_REDUCE_COUNTERS
            assert int(counters.count_nonzero()) == 0, "a counter was left non-zero"
        return out

    return run


def fused_and_unfused(decode, expected_close, *args, **kwargs):
    """The unfused launch, then the fused one twice: the fused outputs equal the unfused one
    bit for bit, and the reference within `expected_close`."""
    unfused = decode(False, *args, **kwargs)
    fused = decode(True, *args, **kwargs)
    again = decode(True, *args, **kwargs)
    expected_close(fused)
    assert torch.equal(fused, unfused), (fused.float() - unfused.float()).abs().max()
    assert torch.equal(again, fused), "two fused launches in a row differ"
    return fused


@pytest.mark.parametrize("num_splits", [2, 3, 8])
@pytest.mark.parametrize("group", [1, 2, 4, 7, 8])
def test_fused_reduce_matches_reference_and_unfused(decode, group, num_splits):
    torch.manual_seed(group * 10 + num_splits)
    num_kv_heads, head_dim, dtype = 2, 32, torch.float32
    k_cache, v_cache, bt, seq_lens = make_paged_kv(LENS, num_kv_heads, head_dim, BLOCK_SIZE,
                                                    dtype)
    query = torch.randn(len(LENS), num_kv_heads * group, head_dim)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, scale)
    fused_and_unfused(decode, lambda out: assert_close(out, expected, dtype), query, k_cache,
                      v_cache, bt, seq_lens, scale, num_splits=num_splits, config=SMALL_TILES)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_reduce_half_precision_qwen2_heads(decode, dtype):
    """Qwen2-0.5B's 14 query / 2 KV heads at head_dim 64, 16-bit caches: the fp32 combine is
    cast to the query's dtype as the reduce kernel casts it."""
    torch.manual_seed(3)
    k_cache, v_cache, bt, seq_lens = make_paged_kv(LENS, 2, 64, BLOCK_SIZE, dtype)
    query = torch.randn(len(LENS), 14, 64).to(dtype)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.125)
    fused_and_unfused(decode, lambda out: assert_close(out, expected, dtype), query, k_cache,
                      v_cache, bt, seq_lens, 0.125, num_splits=3, config=SMALL_TILES)


def test_fused_reduce_default_launch(decode):
    """The default launch config and the split heuristic (2 splits of a 600-token sequence on
    the interpreter's 4 "SMs": partitions of 384 and 216 tokens in 128-token tiles)."""
    torch.manual_seed(5)
    k_cache, v_cache, bt, seq_lens = make_paged_kv([600], 2, 32, BLOCK_SIZE, torch.float16)
    query = torch.randn(1, 8, 32).half()
    assert tri.choose_num_splits(1, 2, bt.shape[1] * BLOCK_SIZE, 4) == 2
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2)
    unfused = decode(False, query, k_cache, v_cache, bt, seq_lens, 0.2)
    fused = decode(True, query, k_cache, v_cache, bt, seq_lens, 0.2)
    assert_close(fused, expected, torch.float16)
    assert torch.equal(fused, unfused)
    keys = [k for k in triton_utils._FITTING_CONFIG if k[0] == "decode" and k[1] == "cpu"]
    assert {k[-1] for k in keys} >= {False, True}  # the fused launch is a launch key of its own


def test_fused_reduce_sliding_window(decode):
    """A 40-token window: the partitions split [seq_len - 40, seq_len), the first partitions
    of the longer sequences start mid-sequence, and those of the shorter ones are empty."""
    torch.manual_seed(7)
    lens = [1, 17, 40, 65, 100, 130]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, 2, 32, BLOCK_SIZE, torch.float32)
    query = torch.randn(len(lens), 8, 32)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                                    sliding_window=40)
    for num_splits in (3, 8):
        fused_and_unfused(decode, lambda out: assert_close(out, expected, torch.float32), query,
                          k_cache, v_cache, bt, seq_lens, 0.2, num_splits=num_splits,
                          config=SMALL_TILES, sliding_window=40)


@pytest.mark.parametrize("group, num_splits", [(4, 3), (7, 8)])
def test_fused_reduce_fp8_cache(decode, group, num_splits):
    """An FP8 cache (V dim-major, the engine's layout; NaN bytes and scales where unused)."""
    k_cache, v_cache, k_scales, v_scales, bt, seq_lens = fp8_paged_kv(
        LENS, 2, 32, BLOCK_SIZE, seed=group + num_splits)
    query = torch.randn(len(LENS), 2 * group, 32)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                                    k_scales=k_scales, v_scales=v_scales)
    fused_and_unfused(decode, lambda out: assert_close_fp8(out, expected), query, k_cache,
                      v_cache, bt, seq_lens, 0.2, num_splits=num_splits,
                      config={**SMALL_TILES, "maxnreg": 128}, k_scales=k_scales,
                      v_scales=v_scales)


def test_one_split_never_touches_the_counters(decode, monkeypatch):
    """num_splits=1 with the switch on: no counters allocated where none exist, and existing
    ones (here holding 5s) left as they are; no reduce kernel either way."""
    torch.manual_seed(9)
    k_cache, v_cache, bt, seq_lens = make_paged_kv(LENS, 2, 32, BLOCK_SIZE, torch.float32)
    query = torch.randn(len(LENS), 8, 32)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2)
    monkeypatch.setattr(tri, "_REDUCE_COUNTERS", {})
    out = decode(True, query, k_cache, v_cache, bt, seq_lens, 0.2, num_splits=1,
                 config=SMALL_TILES)
    assert_close(out, expected, torch.float32)
    assert tri._REDUCE_COUNTERS == {}
    sentinel = torch.full((64,), 5, dtype=torch.int32)
    monkeypatch.setattr(tri, "_REDUCE_COUNTERS", {CPU: sentinel})
    out = tri.paged_attention_decode_triton(query, k_cache, v_cache, bt, seq_lens, 0.2,
                                            num_splits=1, config=SMALL_TILES)
    assert_close(out, expected, torch.float32)
    assert tri._REDUCE_COUNTERS[CPU] is sentinel and bool((sentinel == 5).all())


def test_counters_grow_outside_capture_and_raise_inside(decode, monkeypatch):
    """The counter tensor is allocated at first use and grows when a launch needs more
    (num_seqs * num_kv_heads), the old one kept alive (a graph may hold it); under capture
    (`_capturing`, True here) a launch that fits uses what exists, and one that does not
    raises RuntimeError and allocates nothing."""
    monkeypatch.setattr(tri, "MIN_REDUCE_COUNTERS", 4)
    monkeypatch.setattr(tri, "_REDUCE_COUNTERS", {})
    monkeypatch.setattr(tri, "_RETIRED_COUNTERS", [])
    torch.manual_seed(11)
    lens = [1, 17, 40, 65, 100]
    k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, 2, 32, BLOCK_SIZE, torch.float32)
    query = torch.randn(len(lens), 4, 32)
    expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens, 0.2)

    def run(num_seqs):
        out = decode(True, query[:num_seqs], k_cache, v_cache, bt, seq_lens, 0.2, num_splits=3,
                     config=SMALL_TILES)
        assert_close(out, expected[:num_seqs], torch.float32)

    run(2)  # 4 pairs: the first tensor, MIN_REDUCE_COUNTERS = 4 entries
    first = tri._REDUCE_COUNTERS[CPU]
    assert first.numel() == 4
    run(2)
    assert tri._REDUCE_COUNTERS[CPU] is first
    run(3)  # 6 pairs: grown to 8, the first kept alive
    grown = tri._REDUCE_COUNTERS[CPU]
    assert grown.numel() == 8 and tri._RETIRED_COUNTERS == [first]
    monkeypatch.setattr(tri, "_capturing", lambda device: True)
    run(4)  # 8 pairs fit: no allocation needed under capture
    assert tri._REDUCE_COUNTERS[CPU] is grown
    with pytest.raises(RuntimeError, match=r"needs 10 arrival counters .* 8 exist .* CUDA graph"):
        run(5)
    assert tri._REDUCE_COUNTERS[CPU] is grown and tri._RETIRED_COUNTERS == [first]
    assert tri.fused_reduce_counters("cpu", 8) is grown


def test_switch_is_read_at_each_launch(monkeypatch):
    """Off unless PAGEDRT_DECODE_FUSED_REDUCE is exactly "1"."""
    monkeypatch.delenv(ENV, raising=False)
    assert not tri.decode_fused_reduce_requested()
    for value, on in (("1", True), ("0", False), ("true", False), ("", False)):
        monkeypatch.setenv(ENV, value)
        assert tri.decode_fused_reduce_requested() is on
