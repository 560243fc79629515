"""The Triton exponential race (pagedrt/ops/sample_triton.py) against the torch ops it replaces
(temperature, softmax, clamped noise, division, argmax; argmax for greedy rows), under
TRITON_INTERPRET=1 on CPU: vocabularies over one and several chunks, 16- and 32-bit logits,
strided rows, masked (-inf) tokens, zero noise, ties, and bad arguments."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels can't run")

from pagedrt.ops.sample_triton import BLOCK, race_argmax_triton


def torch_race(logits, noise, temperature, greedy):
    x = logits.float()
    probs = torch.softmax(x / temperature[:, None], dim=-1)
    sampled = (probs / noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(-1)
    return torch.where(greedy != 0, x.argmax(-1), sampled)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [37, BLOCK, 2 * BLOCK + 37])
def test_race_matches_the_torch_ops(dtype, vocab):
    """Mixed greedy and sampled rows at temperatures 0.3 to 2, some tokens masked, some noise
    exactly 0 (the torch path's clamp makes that token win): the same tokens."""
    g = torch.Generator().manual_seed(vocab)
    rows = 6
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    logits[:, ::7] = float("-inf")
    noise = torch.empty(rows, vocab).exponential_(generator=g)
    noise[4, 10] = 0.0  # token 10 of row 4 wins the race (unless masked: it is not)
    temperature = torch.tensor([1.0, 0.3, 2.0, 1.0, 0.7, 1.3])
    greedy = torch.tensor([False, False, True, False, False, True])
    got = race_argmax_triton(logits, noise, temperature, greedy)
    expected = torch_race(logits, noise, temperature, greedy)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected), (got, expected)
    assert int(got[4]) == 10


def test_strided_rows_and_float_flags():
    """Rows of a wider tensor (row stride > vocab), temperature and flags read as columns of
    a parameter table (strided, float flags), as the batched sampler passes them."""
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(5, 300, generator=g)
    logits = wide[:, :250]
    noise = torch.empty(5, 250).exponential_(generator=g)
    params = torch.tensor([[0.8, 0.0], [1.0, 1.0], [1.5, 0.0], [1.0, 1.0], [0.5, 0.0]])
    got = race_argmax_triton(logits, noise, params[:, 0], params[:, 1])
    assert torch.equal(got, torch_race(logits, noise, params[:, 0], params[:, 1]))


def test_ties_take_the_lowest_token_across_chunks():
    """A greedy row whose maximum sits in two chunks takes the lower token id (torch.argmax's
    choice); a row of -inf only gives token 0, as torch.argmax does."""
    vocab = 2 * BLOCK + 5
    logits = torch.zeros(3, vocab)
    logits[0, BLOCK + 3] = logits[0, 2 * BLOCK + 1] = 5.0
    logits[1, 9] = logits[1, BLOCK + 9] = 5.0
    logits[2] = float("-inf")
    ones = torch.ones(3)
    got = race_argmax_triton(logits, torch.ones(3, vocab), ones, ones)
    assert got.tolist() == [BLOCK + 3, 9, 0] == logits.argmax(-1).tolist()


def test_bad_arguments_are_value_errors():
    logits = torch.randn(2, 10)
    noise = torch.ones(2, 10)
    t, g = torch.ones(2), torch.zeros(2)
    with pytest.raises(ValueError, match="unit stride"):
        race_argmax_triton(logits.t().contiguous().t(), noise, t, g)
    with pytest.raises(ValueError, match="int64"):
        race_argmax_triton(logits.long(), noise, t, g)
    with pytest.raises(ValueError, match="noise must be"):
        race_argmax_triton(logits, noise[:, :5], t, g)
    with pytest.raises(ValueError, match="must be \\[2\\]"):
        race_argmax_triton(logits, noise, torch.ones(3), g)
    with pytest.raises(ValueError, match="float32"):
        race_argmax_triton(logits, noise, t.double(), g)
    assert race_argmax_triton(logits[:0], noise[:0], t[:0], g[:0]).shape == (0,)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_engine_tokens_with_the_race_kernel_equal_the_torch_ops(tiny, monkeypatch, scheduling):
    """The engine's sampler through the Triton race (PAGEDRT_SAMPLE_KERNEL=1, the interpreter
    here) gives the tokens of the torch ops (=0): seeded and unseeded rows at several
    temperatures, greedy rows beside them, one with top-k (the filtered form)."""
    from pagedrt import LLM, SamplingParams

    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1" if scheduling == "async" else "0")
    prompts = [[1, 5, 9, 20, 7], list(range(3, 30)), [4] * 9, list(range(100, 140))]
    params = [SamplingParams(temperature=0.7, seed=11, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.3, seed=12, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=13, top_k=20, max_tokens=12,
                             ignore_eos=True)]
    tokens = {}
    for kernel in ("1", "0"):
        monkeypatch.setenv("PAGEDRT_SAMPLE_KERNEL", kernel)
        llm = LLM(tiny, num_kv_blocks=64, block_size=16)
        assert llm.llm_engine.model_runner.sampler.kernel == (kernel == "1")
        for batch in (prompts, prompts[:2]):  # alone and in a batch: same seeded tokens
            outs = llm.generate(batch, params[: len(batch)], use_tqdm=False)
            tokens[kernel, len(batch)] = [o.outputs[0].token_ids for o in outs]
    assert tokens["1", 4] == tokens["0", 4]
    assert tokens["1", 2] == tokens["0", 2] == tokens["0", 4][:2]
