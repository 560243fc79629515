"""The counter-based draws' Triton kernel on CUDA (pagedrt/ops/philox_triton.py) against the
torch path, at Qwen2's vocabulary, and seeded sampling through the engine's batched sampler.
Run on the H200: python3 -m pytest -m gpu tests/gpu/test_philox_gpu.py"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedrt.engine.sampler import Sampler
from pagedrt.engine.sampling_state import SamplingState
from pagedrt.ops.philox import STREAM_ACCEPT, STREAM_RACE, counter_draws
from pagedrt.ops.philox_triton import fill_counter_draws_triton
from pagedrt.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("exponential", [False, True])
def test_kernel_equals_the_torch_draws_at_qwen2_vocab(exponential):
    """64 seeded rows of 256, 151,936 entries each, 2 positions: the uniforms bit for bit, the
    Exp(1) draws to float32 rounding of the log."""
    g = torch.Generator(device="cuda").manual_seed(0)
    vocab, num_pos = 151936, 2
    index = torch.randperm(256, device="cuda", generator=g)[:64]
    keys = torch.randint(-2**62, 2**62, (64,), device="cuda", generator=g)
    positions = torch.randint(0, 32768, (64, num_pos), device="cuda", generator=g)
    out = torch.full((256, num_pos, vocab), -1.0, device="cuda")
    stream = STREAM_RACE if exponential else STREAM_ACCEPT
    fill_counter_draws_triton(out, index, keys, positions, stream, exponential)
    ref = counter_draws(keys, positions, vocab, stream, exponential)
    if exponential:
        torch.testing.assert_close(out[index], ref, rtol=2e-6, atol=1e-6)
    else:
        assert torch.equal(out[index], ref)
    untouched = torch.ones(256, dtype=torch.bool, device="cuda")
    untouched[index] = False
    assert (out[untouched] == -1.0).all()


def test_seeded_rows_sample_the_same_tokens_on_cuda_and_cpu():
    """256 rows at temperature 0.9 (every other one seeded), Qwen2's vocabulary: the seeded
    rows' tokens on CUDA (kernel draws, Triton race) equal those on the CPU (torch draws,
    torch race) but where two candidates agree to float32 rounding (at most 1 row in 100)."""
    rows_n, vocab = 256, 151936
    logits = torch.randn(rows_n, vocab, generator=torch.Generator().manual_seed(1)) * 3
    tokens = {}
    for device in ("cpu", "cuda"):
        state = SamplingState(rows_n, torch.device(device))
        for r in range(rows_n):
            state.set_row(r, f"r{r}", SamplingParams(temperature=0.9,
                                                     seed=r if r % 2 else None), 0, [1], [], ())
        rows = np.arange(rows_n, dtype=np.int64)
        out = Sampler().sample_rows(logits.to(device), state, rows, [None] * rows_n,
                                    np.full(rows_n, 7, dtype=np.int64))
        tokens[device] = out.token_ids.cpu()[1::2]
    assert (tokens["cpu"] != tokens["cuda"]).sum().item() <= 1
