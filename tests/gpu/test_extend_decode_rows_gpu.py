"""One-token chunks on the extend kernel's narrow tile (NARROW_M), compiled on a CUDA GPU:
a mixed launch (prompts, chunks over prefixes, decode rows with contexts up to 4,097) against
the torch reference and against the wide tile (PAGEDRT_EXTEND_NARROW_DECODE=0), over a bf16
cache and an FP8 cache with the step's rows, at Llama-3-8B's and Qwen2-0.5B's head shapes.
Run on the H200 with `python3 -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from pagedrt.bench.attention import fp8_cache
from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri
from pagedrt.ops.triton_utils import to_v_dim_major

CUDA = torch.device("cuda")
BLOCK = 16


def _mixed(num_heads, num_kv_heads, head_dim, fp8):
    prefixes = [0, 0, 15, 16, 4096, 300, 33, 2047]
    q_lens = [300, 1, 1, 1, 1, 77, 1, 64]
    lens = [p + q for p, q in zip(prefixes, q_lens)]
    per_seq = [-(-n // BLOCK) for n in lens]
    shape = (sum(per_seq), BLOCK, num_kv_heads, head_dim)
    k = torch.randn(shape, device=CUDA, dtype=torch.bfloat16)
    v = torch.randn(shape, device=CUDA, dtype=torch.bfloat16)
    perm = torch.randperm(shape[0], device=CUDA)
    bt = torch.zeros(len(lens), max(per_seq), dtype=torch.int32, device=CUDA)
    used = 0
    for i, nb in enumerate(per_seq):
        bt[i, :nb] = perm[used:used + nb].int()
        used += nb
    tokens = sum(q_lens)
    query = torch.randn(tokens, num_heads, head_dim, device=CUDA, dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=CUDA)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    kw = {}
    if fp8:
        (k, ks), (v, vs) = fp8_cache(k), fp8_cache(v)
        v = to_v_dim_major(v)
        rows = [torch.randn(tokens, num_kv_heads, head_dim, device=CUDA, dtype=torch.bfloat16)
                for _ in range(2)]
        kw = {"k_scales": ks, "v_scales": vs, "key": rows[0], "value": rows[1]}
    return (query, k, v, bt, cu, seq_lens, head_dim ** -0.5), kw


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("heads", [(32, 8, 128), (14, 2, 64)])
def test_decode_rows_on_the_narrow_tile_on_gpu(fp8, heads, monkeypatch):
    torch.manual_seed(len(heads) + heads[0])
    args, kw = _mixed(*heads, fp8)
    expected = ref.paged_attention_extend_reference(*args, **kw).float()
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("PAGEDRT_EXTEND_NARROW_DECODE", flag)
        outs.append(tri.paged_attention_extend_triton(*args, **kw).float())
    for out in outs:
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("config", ["64,64,4,2", "64,32,4,2", "128,64,8,2"])
@pytest.mark.parametrize("heads", [(32, 8, 128), (14, 2, 64)])
def test_extend_config_override_on_gpu(config, heads, monkeypatch):
    """PAGEDRT_EXTEND_CONFIG's tiles (the ones prefill_parts.py times) over the mixed launch
    and a bf16 cache: equal to the reference."""
    torch.manual_seed(heads[0])
    args, kw = _mixed(*heads, False)
    expected = ref.paged_attention_extend_reference(*args, **kw).float()
    monkeypatch.setenv("PAGEDRT_EXTEND_CONFIG", config)
    out = tri.paged_attention_extend_triton(*args, **kw).float()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
