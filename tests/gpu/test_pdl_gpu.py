"""Programmatic dependent launch (PAGEDRT_PDL=1, `pdl_enabled`) on the H200: the decode step's
Triton kernels launched with PDL, inside CUDA graphs and eagerly, give the tokens they give
without it. Run on the H200: python3 -m pytest -m gpu tests/gpu/test_pdl_gpu.py"""

from __future__ import annotations

import pytest
import torch
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.ops import triton_utils

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="needs a CUDA GPU of compute capability 9.0 or later")


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_engine_tokens_with_and_without_pdl(monkeypatch, enforce_eager):
    """fp32 tiny model, greedy, 1 and 4 requests (the GEMV path) and 12 (the cuBLAS path):
    the same tokens with PAGEDRT_PDL=1 as without."""
    loaded = build_tiny_llama(seed=0)
    loaded = loaded._replace(model=loaded.model.to("cuda"))
    prompts = [[1, 5, 9, 20, 7], list(range(3, 40)), list(range(100, 164)), [7]] * 3
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = {}
    for pdl in (False, True):
        monkeypatch.setattr(triton_utils, "PDL_REQUESTED", pdl)
        assert triton_utils.pdl_enabled(torch.zeros(1, device="cuda")) == pdl
        llm = LLM(loaded, num_kv_blocks=64, block_size=16, enforce_eager=enforce_eager,
                  max_num_seqs=16)
        outs[pdl] = [[o.outputs[0].token_ids for o in llm.generate(prompts[:n], params,
                                                                    use_tqdm=False)]
                     for n in (1, 4, 12)]
        del llm
    assert outs[True] == outs[False]
