"""The race kernel with each row's vocabulary split over several programs (pagedrt/ops/
sample_triton.py, "Split rows"; PAGEDRT_SAMPLE_SPLIT=1 in the engine) under TRITON_INTERPRET=1:
the same tokens as one program a row and as the torch ops, at every split count from 1 to one
span per BLOCK; `argmax_triton` against torch.argmax
(ties across spans, NaN, rows of -inf, strided rows, `out`); the arrival counters left at 0
so that the next launch is right too; bad arguments; the engine's tokens with the switch."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.sample_triton import (
    BLOCK,
    MAX_SPLITS,
    argmax_triton,
    race_argmax_triton,
    sample_splits,
)


def torch_race(logits, noise, temperature, greedy):
    x = logits.float()
    probs = torch.softmax(x / temperature[:, None], dim=-1)
    sampled = (probs / noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(-1)
    return torch.where(greedy != 0, x.argmax(-1), sampled)


def counters_are_zero(device="cpu"):
    return bool((arrival_counters(device, 1) == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [BLOCK, BLOCK + 1, 3 * BLOCK + 37])
def test_split_race_equals_one_program_a_row_and_the_torch_ops(dtype, vocab):
    """Mixed greedy and sampled rows, some tokens masked, one noise exactly 0 in the last
    span: every split count gives the unsplit launch's tokens, which are the torch ops', and
    a second launch after each (the counters reset by the first) gives them again."""
    g = torch.Generator().manual_seed(vocab)
    rows = 5
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    logits[:, ::7] = float("-inf")
    noise = torch.empty(rows, vocab).exponential_(generator=g)
    noise[3, vocab - 2] = 0.0  # this token of row 3 wins its race (not masked: see below)
    logits[3, vocab - 2] = 0.0
    temperature = torch.tensor([1.0, 0.3, 2.0, 0.7, 1.3])
    greedy = torch.tensor([False, True, False, False, True])
    expected = torch_race(logits, noise, temperature, greedy)
    assert int(expected[3]) == vocab - 2
    for splits in range(1, -(-vocab // BLOCK) + 2):  # one past the most (capped to it)
        for _ in range(2):
            got = race_argmax_triton(logits, noise, temperature, greedy, num_splits=splits)
            assert torch.equal(got, expected), (splits, got, expected)
            assert counters_are_zero()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_matches_torch_argmax(dtype):
    """Random rows, a maximum tied across two spans (the lower span's token wins), a tie
    inside one span, a row of -inf only (token 0), a NaN (torch.argmax takes it), at every
    split count and with the splits chosen for the batch."""
    vocab = 3 * BLOCK + 5
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(6, vocab, generator=g).to(dtype)
    logits[1, BLOCK + 3] = logits[1, 2 * BLOCK + 1] = 50.0
    logits[2, 10] = logits[2, 20] = 50.0
    logits[3] = float("-inf")
    logits[4, 2 * BLOCK + 9] = float("nan")
    logits[5, vocab - 1] = 50.0
    expected = logits.argmax(-1)
    assert expected.tolist()[1:] == [BLOCK + 3, 10, 0, 2 * BLOCK + 9, vocab - 1]
    for splits in (None, 1, 2, 3, 4):
        got = argmax_triton(logits, num_splits=splits)
        assert got.dtype == torch.int64
        assert torch.equal(got, expected), (splits, got, expected)
    assert counters_are_zero()


def test_argmax_strided_rows_into_out():
    """Rows of a wider tensor, written into a given `out` (the graph runner's last tokens)."""
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(3, 2 * BLOCK + 100, generator=g)
    logits = wide[:, : 2 * BLOCK + 50]
    out = torch.full((3,), -1, dtype=torch.int64)
    got = argmax_triton(logits, num_splits=3, out=out)
    assert got is out
    assert torch.equal(out, logits.argmax(-1))


def test_sample_splits():
    """About four programs per SM, at most one span per BLOCK, at least one."""
    vocab = 151936  # Qwen2's
    assert sample_splits(1, vocab, 132) == -(-vocab // BLOCK) == 38
    assert sample_splits(64, vocab, 132) == 9
    assert sample_splits(256, vocab, 132) == 3
    assert sample_splits(600, vocab, 132) == 1
    assert sample_splits(0, vocab, 132) == 1
    assert sample_splits(3, 100, 132) == 1
    assert sample_splits(1, 1 << 20, 132) == MAX_SPLITS == 64  # a 1M-token vocabulary


def test_bad_arguments_are_value_errors():
    logits = torch.randn(2, 10)
    with pytest.raises(ValueError, match="num_splits is 0; use 1 to 64"):
        argmax_triton(logits, num_splits=0)
    with pytest.raises(ValueError, match="num_splits is 65"):
        argmax_triton(logits, num_splits=65)
    with pytest.raises(ValueError, match="out must be \\[2\\] int64"):
        argmax_triton(logits, out=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="unit stride"):
        argmax_triton(logits.t().contiguous().t())
    with pytest.raises(ValueError, match="2\\*\\*24"):
        argmax_triton(torch.zeros(1, 1 << 24), num_splits=2)
    assert argmax_triton(logits[:0]).shape == (0,)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_engine_tokens_with_split_sampling_equal_without(tiny, monkeypatch, scheduling):
    """The engine through the Triton kernels (PAGEDRT_SAMPLE_KERNEL=1) with
    PAGEDRT_SAMPLE_SPLIT=1 against =0: a greedy batch (the argmax kernel), and seeded rows at
    several temperatures beside greedy ones, one with top-p (the race over the filtered
    rows), give the same tokens; no KV block is left in use. The tiny model's 384 tokens are
    one BLOCK, so the test shrinks BLOCK to 128 for three spans a row, and checks that the
    launches split."""
    from pagedrt import LLM, SamplingParams
    from pagedrt.ops import sample_triton

    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1" if scheduling == "async" else "0")
    monkeypatch.setenv("PAGEDRT_SAMPLE_KERNEL", "1")
    monkeypatch.setattr(sample_triton, "BLOCK", 128)
    launched = []
    real_launch = sample_triton._launch
    monkeypatch.setattr(sample_triton, "_launch",
                        lambda logits, num_splits, *a, **k: launched.append(num_splits)
                        or real_launch(logits, num_splits, *a, **k))
    prompts = [[1, 5, 9, 20, 7], list(range(3, 30)), [4] * 9, list(range(100, 140))]
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    mixed = [SamplingParams(temperature=0.7, seed=11, max_tokens=10, ignore_eos=True),
             SamplingParams(temperature=1.3, seed=12, max_tokens=10, ignore_eos=True),
             greedy,
             SamplingParams(temperature=0.9, seed=14, top_p=0.8, max_tokens=10,
                            ignore_eos=True)]
    tokens = {}
    for split in ("1", "0"):
        monkeypatch.setenv("PAGEDRT_SAMPLE_SPLIT", split)
        llm = LLM(tiny, num_kv_blocks=64, block_size=16)
        assert llm.llm_engine.model_runner.sampler.split == (split == "1")
        for name, params in (("greedy", [greedy] * 4), ("mixed", mixed)):
            outs = llm.generate(prompts, params, use_tqdm=False)
            tokens[split, name] = [o.outputs[0].token_ids for o in outs]
        assert llm.llm_engine.scheduler.kv.num_free_blocks == 64
        if split == "1":  # (4 SMs under the interpreter: 3 spans at 1-5 rows)
            assert launched and max(launched) == 3, launched
    assert tokens["1", "greedy"] == tokens["0", "greedy"]
    assert tokens["1", "mixed"] == tokens["0", "mixed"]
    assert tokens["1", "mixed"][2] == tokens["1", "greedy"][2]


def test_sampler_warm_up_launches_each_kernel_form(monkeypatch):
    """`Sampler.warm_up` (the engine's start-up, on CUDA) launches the race and the greedy
    argmax, each in one span and in the spans of the batch, so no request compiles them;
    nothing with the kernel or the split off."""
    from pagedrt.engine.sampler import Sampler
    from pagedrt.ops import sample_triton

    monkeypatch.setattr(sample_triton, "BLOCK", 128)  # 3 spans of 384 logits (4 SMs here)
    launched = []
    real_launch = sample_triton._launch
    monkeypatch.setattr(sample_triton, "_launch",
                        lambda logits, num_splits, *a, **k: launched.append(
                            (num_splits, k.get("all_greedy", False)))  # (_launch's default)
                        or real_launch(logits, num_splits, *a, **k))
    logits = torch.zeros(1, 384)
    Sampler(kernel=True).warm_up(logits)
    assert sorted(launched) == [(1, False), (1, True), (3, False), (3, True)]
    assert counters_are_zero()
    launched.clear()
    monkeypatch.setenv("PAGEDRT_SAMPLE_SPLIT", "0")
    Sampler(kernel=True).warm_up(logits)
    assert launched == [(1, False)]
    launched.clear()
    Sampler(kernel=False).warm_up(logits)
    assert launched == []
