"""The decoder end to end on the tiny model with the 8-128-row decode matmul path forced on
the CPU (the Triton interpreter runs its kernels), shared by the tests of its fused ops
(tests/test_matmul_triton.py, tests/test_matmul_rope.py)."""

from __future__ import annotations

import torch

from pagedrt.models import layers
from pagedrt.ops import matmul_triton
from pagedrt.ops.matmul_triton import row_count_timed
from pagedrt.sampling_params import SamplingParams


def prompts_and_params(g: torch.Generator) -> tuple[list[list[int]], SamplingParams]:
    """16 prompts of 3-18 tokens, greedy with logprobs, 6 tokens each."""
    prompts = [torch.randint(0, 384, (3 + i,), generator=g).tolist() for i in range(16)]
    return prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)


def mixed_sampling(n: int) -> list[SamplingParams]:
    """Per-request params for n prompts, a mixed batch: greedy, then seeded sampling with
    top-k, top-p, min-p, and presence / frequency / repetition penalties, in turn."""
    kinds = [{"temperature": 0.0}, {"temperature": 0.8, "top_k": 20},
             {"temperature": 0.9, "top_p": 0.8}, {"temperature": 1.0, "min_p": 0.1},
             {"temperature": 0.7, "presence_penalty": 0.5, "frequency_penalty": 0.3,
              "repetition_penalty": 1.2}]
    return [SamplingParams(max_tokens=6, ignore_eos=True, logprobs=1, seed=100 + i,
                           **kinds[i % len(kinds)]) for i in range(n)]


def generate_8_and_16(monkeypatch, model, prompts, params, tiled: bool, choice,
                      patches: tuple = ()) -> list:
    """The outputs of the first 8, then the 16 prompts (params: one for all, or a list of one
    per prompt), in an engine of their own, with
    `matmul_triton._choice` replaced by `choice` (key, baseline, candidate, configs) -> config
    or None, every tensor eligible for the path, and with `tiled` the layers routing 8-128 rows
    to it; `patches`: more (object, attribute, value) to set meanwhile."""
    from pagedrt.entrypoints.llm import LLM

    with monkeypatch.context() as mp:
        for obj, name, value in patches:
            mp.setattr(obj, name, value)
        mp.setattr(matmul_triton, "_choice", choice)
        mp.setattr(matmul_triton, "_eligible",
                   lambda x, w, fused=False: x.dim() == 2 and row_count_timed(x.shape[0],
                                                                               fused))
        if tiled:
            mp.setattr(layers, "_decode_matmul", lambda x: x.dim() == 2 and 8 <= len(x) <= 128)
        llm = LLM(model, num_kv_blocks=64, block_size=8)
        return [o.outputs[0] for n in (8, 16)
                for o in llm.generate(prompts[:n],
                                      params[:n] if isinstance(params, list) else params,
                                      use_tqdm=False)]


def assert_same_tokens(got: list, want: list, logprob_tol: float = 1e-4) -> None:
    """Equal token ids, and each token's logprob within `logprob_tol`."""
    for t, p in zip(got, want, strict=True):
        assert t.token_ids == p.token_ids
        for lt, lp in zip(t.logprobs, p.logprobs, strict=True):
            assert lt.token_id == lp.token_id and abs(lt.logprob - lp.logprob) < logprob_tol


def fall_back(key, baseline, candidate, configs=None):
    """A `choice` that keeps every op on its plain path."""
    return
