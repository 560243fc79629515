"""The decode attention's split-K combine in the O projection's prologue
(`gemv_triton.gemv_attn_combine_triton`, `RowParallelLinear.forward_partials`) against the
reduce kernel and the plain projection, under the Triton interpreter on CPU; and the decoder's
tokens with it on the tiny model."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch.nn.functional as F

from pagedrt.models import layers
from pagedrt.ops import attention_triton, gemv_triton
from pagedrt.ops.attention_triton import paged_attention_decode_triton, reduce_partials
from pagedrt.ops.decode_partials import DecodePartials
from pagedrt.ops.gemv_triton import (
    MAX_ROWS,
    combine_chunk_fits,
    gemv_attn_combine_triton,
    pre_wait_columns,
)
from tests.test_gemv_fused import _assert_fused_gives_the_plain_tokens, _params, _perturbed_norms


def _partials(m: int, heads: int, splits: int, head_dim: int, g: torch.Generator,
              dtype=torch.float32) -> DecodePartials:
    """Random partials with log-sum-exps spread over +-6 (log2 domain) and, in the first
    row, an empty last partition (-inf) for one head and for all but one of another's."""
    part_out = torch.randn(m, heads, splits, head_dim, generator=g)
    part_lse = 3.0 * torch.randn(m, heads, splits, generator=g)
    part_lse[0, 0, -1] = float("-inf")
    part_lse[0, heads - 1, 1:] = float("-inf")
    return DecodePartials(part_out, part_lse, splits, dtype)


CASES = [  # rows, heads, splits, head_dim, output columns, config
    (1, 14, 2, 64, 40, (4, 1024, 4)),  # Qwen2-0.5B's heads: 896 columns, a masked tail
    (1, 14, 3, 64, 24, (8, 256, 4)),  # 3 splits: a padded split, PRE_K then the loop
    (2, 4, 5, 16, 33, (8, 64, 4)),  # masked output rows
    (3, 6, 2, 32, 16, (16, 128, 4)),
    (4, 2, 8, 128, 8, (4, 512, 4)),
]


@pytest.mark.parametrize("m,heads,splits,head_dim,n,config", CASES)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_combine_prologue_matches_the_reduce_and_the_projection(m, heads, splits, head_dim, n,
                                                                config, bias):
    g = torch.Generator().manual_seed(m * 100 + splits)
    parts = _partials(m, heads, splits, head_dim, g)
    w = torch.randn(n, heads * head_dim, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    want = F.linear(reduce_partials(parts).flatten(1), w, b)
    got = gemv_attn_combine_triton(parts, w, b, config)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rounds_the_combined_input_as_the_reduce_stores_it(dtype):
    """The reduce stores its output in the model's dtype and the projection reads that: the
    prologue rounds each combined value the same way (products then summed in fp32)."""
    g = torch.Generator().manual_seed(7)
    parts = _partials(2, 14, 4, 64, g, dtype)
    w = torch.randn(24, 14 * 64, generator=g).to(dtype)
    out = reduce_partials(parts)
    assert out.dtype == dtype
    want = F.linear(out.float().flatten(1), w.float())  # fp32 sums of the rounded inputs
    got = gemv_attn_combine_triton(parts, w, None, (8, 256, 4))
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=0, atol=2 * want.abs().max().item() / 256)


def test_decode_partials_reduce_to_the_decode_output():
    """`partials=True` hands back the split launch's partials, which `reduce_partials` combines
    into exactly the output of the plain call; an unsplit launch returns its output."""
    g = torch.Generator().manual_seed(3)
    num_blocks, block_size, kv_heads, heads, d = 12, 8, 2, 6, 32
    k_cache = torch.randn(num_blocks, block_size, kv_heads, d, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, d, generator=g)
    q = torch.randn(3, heads, d, generator=g)
    block_tables = torch.randperm(num_blocks, generator=g)[:12].view(3, 4).to(torch.int32)
    seq_lens = torch.tensor([32, 17, 1], dtype=torch.int32)  # 4 blocks, a block + 1, one token
    args = (q, k_cache, v_cache, block_tables, seq_lens, d ** -0.5)
    plain = paged_attention_decode_triton(*args, num_splits=3)
    parts = paged_attention_decode_triton(*args, num_splits=3, partials=True)
    assert isinstance(parts, DecodePartials) and parts.num_splits == 3
    assert parts.part_out.shape == (3, heads, 3, d) and parts.part_lse.shape == (3, heads, 3)
    torch.testing.assert_close(reduce_partials(parts), plain, rtol=0, atol=0)
    whole = paged_attention_decode_triton(*args, num_splits=1, partials=True)
    torch.testing.assert_close(whole, paged_attention_decode_triton(*args, num_splits=1))


def test_bad_inputs():
    g = torch.Generator().manual_seed(0)
    parts = _partials(2, 4, 3, 16, g)
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match="do not fit weight"):
        gemv_attn_combine_triton(parts, torch.randn(8, 60))
    with pytest.raises(ValueError, match="do not fit weight"):
        gemv_attn_combine_triton(parts._replace(num_splits=2), w)
    with pytest.raises(ValueError, match="serves 1 to"):
        gemv_attn_combine_triton(_partials(MAX_ROWS + 1, 4, 3, 16, g), w)
    with pytest.raises(ValueError, match="contiguous fp32"):
        gemv_attn_combine_triton(parts._replace(part_out=parts.part_out.double()), w)
    with pytest.raises(ValueError, match="bias"):
        gemv_attn_combine_triton(parts, w, torch.randn(7))


def test_combine_chunk_fits():
    """A config fits where next_pow2(splits) x its widest chunk (BLOCK_K or the columns
    loaded before the wait) stays within COMBINE_TILE_VALUES."""
    k = 896
    for cfg in [(4, 2048, 8), (8, 256, 4), (32, 128, 4), (16, 512, 8)]:
        cols = max(cfg[1], pre_wait_columns(cfg[0], k, cfg[2]))
        for splits in (2, 3, 4, 8, 16):
            fits = triton_pow2(splits) * cols <= gemv_triton.COMBINE_TILE_VALUES
            assert combine_chunk_fits(cfg, k, splits) == fits
    assert combine_chunk_fits((8, 256, 4), k, 2) and not combine_chunk_fits((4, 2048, 8), k, 16)


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_tensor_parallel_keeps_the_reduce_and_the_projection(monkeypatch):
    """With tp_size > 1 the combine is never timed or fused: the reduce, then the layer (its
    all-reduce once)."""
    from pagedrt.distributed.group import TPGroup
    from pagedrt.models.layers import RowParallelLinear

    class CountingGroup(TPGroup):
        def all_reduce(self, x):
            reduced.append(x.shape)
            return x

    reduced, timed = [], []
    monkeypatch.setattr(gemv_triton, "fused_or_unfused", lambda *a, **k: timed.append(a))
    o_proj = RowParallelLinear(64, 8, tp=CountingGroup(rank=0, size=2))  # 32 columns a rank
    torch.nn.init.normal_(o_proj.weight)
    parts = _partials(2, 2, 3, 16, torch.Generator().manual_seed(1))
    y = o_proj.forward_partials(parts)
    torch.testing.assert_close(y, F.linear(reduce_partials(parts).flatten(1), o_proj.weight))
    assert timed == [] and len(reduced) == 1


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_with_the_combine_in_the_o_projection_gives_the_plain_tokens(
        tiny_model, monkeypatch, sampling):
    """With PAGEDRT_FUSED_ATTN_COMBINE=1, decode steps of 1-4 rows over a split decode launch
    (3 partitions, forced) hand the partials to the O projection, which combines them (fused, one config for every shape):
    tokens and logprobs as the plain modules' with the reduce kernel, greedy and with seeded
    sampling."""
    from pagedrt.entrypoints.llm import LLM
    from tests.tiny_model import build_tiny_llama

    calls = []

    def always_fused(key, unfused, fused, *_, **__):
        calls.append(key[0])
        return fused((8, 128, 4))

    monkeypatch.setattr(layers, "_small_batch_fusion",
                        lambda x, *w: x.dim() == 2 and x.shape[0] <= MAX_ROWS)
    monkeypatch.setattr(gemv_triton, "fused_or_unfused", always_fused)
    monkeypatch.setattr(attention_triton, "choose_num_splits", lambda *a, **k: 3)
    monkeypatch.setattr(layers, "ATTN_COMBINE_FUSION", True)  # opt-in
    model = build_tiny_llama(seed=0)
    _perturbed_norms(model.model)
    prompts = [[5, 9, 200, 17], [1, 2, 3], [300, 301, 7, 8, 9, 10], [42]]
    llm = LLM(model, num_kv_blocks=64, block_size=8, attention_backend="triton")
    for count in (1, 4):
        params = _params(sampling, count, 8)
        _assert_fused_gives_the_plain_tokens(llm, prompts[:count], params, monkeypatch)
    assert "attn_combine" in calls


def test_the_combine_is_opt_in():
    """Off unless PAGEDRT_FUSED_ATTN_COMBINE=1 (unmeasured faster on the H200)."""
    import subprocess
    import sys

    code = "from pagedrt.models import layers; print(layers.ATTN_COMBINE_FUSION)"
    for env, want in ((None, "False"), ("0", "False"), ("1", "True")):
        environ = {k: v for k, v in os.environ.items() if k != "PAGEDRT_FUSED_ATTN_COMBINE"}
        if env is not None:
            environ["PAGEDRT_FUSED_ATTN_COMBINE"] = env
        out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == want, (env, out)
