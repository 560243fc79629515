"""The skinny matmul with a fused prologue (pagedrt/ops/gemv_triton.py: RMSNorm with the
residual add, or SiLU-and-mul) against the unfused torch modules it replaces, under the Triton
interpreter on CPU; and the decoder layers' small-batch path end to end on the tiny model."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

from pagedrt.models import layers
from pagedrt.models.layers import RMSNorm, SiluAndMul
from pagedrt.ops import gemv_triton
from pagedrt.ops.gemv_triton import CONFIGS, MAX_ROWS, gemv_rmsnorm_triton, gemv_silu_mul_triton
from pagedrt.sampling_params import SamplingParams

SOME_CONFIGS = [CONFIGS[0], CONFIGS[3], CONFIGS[-1]]


def _norm(k: int, g: torch.Generator, dtype=torch.float32) -> RMSNorm:
    norm = RMSNorm(k, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.3 * torch.randn(k, generator=g))
    return norm.to(dtype)


@pytest.mark.parametrize("config", SOME_CONFIGS, ids=[f"n{c[0]}k{c[1]}w{c[2]}" for c in SOME_CONFIGS])
@pytest.mark.parametrize("m", range(1, MAX_ROWS + 1))
def test_rmsnorm_prologue_matches_the_modules(m, config):
    g = torch.Generator().manual_seed(m * 31 + config[0])
    n, k = 70, 300  # neither a multiple of any tile
    norm = _norm(k, g)
    x, residual = torch.randn(m, k, generator=g), torch.randn(m, k, generator=g)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for bias in (None, b):
        y, new_residual = gemv_rmsnorm_triton(x, residual, norm.weight.data, norm.eps, w, bias,
                                              config)
        h, want_residual = norm(x, residual)
        torch.testing.assert_close(new_residual, want_residual, rtol=0, atol=0)
        torch.testing.assert_close(y, torch.nn.functional.linear(h, w, bias), rtol=1e-5,
                                   atol=1e-4)
        y, none = gemv_rmsnorm_triton(x, None, norm.weight.data, norm.eps, w, bias, config)
        assert none is None
        torch.testing.assert_close(y, torch.nn.functional.linear(norm(x), w, bias), rtol=1e-5,
                                   atol=1e-4)


def test_rmsnorm_prologue_past_one_load_of_the_row():
    """The 1/rms takes a row in loads of `rstd_block(K)` columns: the whole row where K fits
    8,192, else several; a K of 9,000 takes two (and the new residual is still exact)."""
    from pagedrt.ops.gemv_triton import rstd_block

    assert [rstd_block(k) for k in (300, 896, 4096, 9000)] == [512, 1024, 4096, 8192]
    g = torch.Generator().manual_seed(5)
    n, k = 6, 9000
    norm = _norm(k, g)
    x, residual = torch.randn(2, k, generator=g), torch.randn(2, k, generator=g)
    w = torch.randn(n, k, generator=g)
    y, new_residual = gemv_rmsnorm_triton(x, residual, norm.weight.data, norm.eps, w, None,
                                          (8, 512, 4))
    h, want_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, want_residual, rtol=0, atol=0)
    torch.testing.assert_close(y, torch.nn.functional.linear(h, w), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("config", SOME_CONFIGS, ids=[f"n{c[0]}k{c[1]}w{c[2]}" for c in SOME_CONFIGS])
@pytest.mark.parametrize("m", range(1, MAX_ROWS + 1))
def test_silu_mul_prologue_matches_the_modules(m, config):
    g = torch.Generator().manual_seed(m * 17 + config[0])
    n, k = 50, 260
    big = torch.randn(m, 2 * k + 8, generator=g)
    x = big[:, : 2 * k]  # strided rows: a slice of a wider buffer
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for bias in (None, b):
        got = gemv_silu_mul_triton(x, w, bias, config)
        want = torch.nn.functional.linear(SiluAndMul()(x), w, bias)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_half_precision_rounds_where_the_modules_round():
    """bf16: the residual sum within one bf16 step (the interpreter's fp32 -> bf16 cast
    truncates where the GPU rounds to nearest), and the output within a few bf16 ulps of the
    modules' chain (which rounds the normed activations to bf16 before the matmul)."""
    g = torch.Generator().manual_seed(3)
    m, n, k = 3, 40, 256
    norm = _norm(k, g, torch.bfloat16)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    residual = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / 16).to(torch.bfloat16)
    y, new_residual = gemv_rmsnorm_triton(x, residual, norm.weight.data, norm.eps, w, None,
                                          (8, 128, 4))
    h, want_residual = norm(x, residual)
    torch.testing.assert_close(new_residual.float(), want_residual.float(), rtol=2**-7, atol=0)
    want = h.float() @ w.float().T
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)
    gu = torch.randn(m, 2 * k, generator=g).to(torch.bfloat16)
    got = gemv_silu_mul_triton(gu, w, None, (8, 128, 4)).float()
    torch.testing.assert_close(got, SiluAndMul()(gu).float() @ w.float().T, rtol=2e-2,
                               atol=2e-2)


def test_bad_inputs():
    x, w, nw = torch.randn(2, 8), torch.randn(4, 8), torch.ones(8)
    with pytest.raises(ValueError, match="5 rows"):
        gemv_rmsnorm_triton(torch.randn(5, 8), None, nw, 1e-6, w)
    with pytest.raises(ValueError, match="norm_weight"):
        gemv_rmsnorm_triton(x, None, torch.ones(9), 1e-6, w)
    with pytest.raises(ValueError, match="residual"):
        gemv_rmsnorm_triton(x, torch.randn(3, 8), nw, 1e-6, w)
    with pytest.raises(ValueError, match="do not fit"):
        gemv_silu_mul_triton(x, w)  # x must be [M, 2K] for a [N, K] weight
    with pytest.raises(ValueError, match="must match"):
        gemv_silu_mul_triton(torch.randn(2, 16), w.double())


@pytest.fixture
def fused_everywhere(monkeypatch):
    """The layers take the fused path on CPU tensors (the interpreter runs the kernels), with
    one config for every shape; counts the fused calls."""
    calls = []

    def always_fused(key, unfused, fused, *_, **__):
        calls.append(key[0])
        return fused((8, 128, 4))

    monkeypatch.setattr(layers, "_small_batch_fusion",
                        lambda x, *w: x.dim() == 2 and x.shape[0] <= MAX_ROWS)
    monkeypatch.setattr(gemv_triton, "fused_or_unfused", always_fused)
    return calls


def _perturbed_norms(model):
    from tests.tiny_model import perturb_norms

    perturb_norms(model, torch.Generator().manual_seed(11))


def _assert_fused_gives_the_plain_tokens(llm, prompts, params, monkeypatch) -> None:
    """Generate with the small-batch fusions as the test set them up, then with every one off
    (the plain modules), and compare (`_assert_same_tokens`)."""
    fused_outs = llm.generate(prompts, params, use_tqdm=False)
    with monkeypatch.context() as m:
        m.setattr(layers, "_small_batch_fusion", lambda x, *w: False)
        plain_outs = llm.generate(prompts, params, use_tqdm=False)
    _assert_same_tokens(fused_outs, plain_outs)


def _assert_same_tokens(fused_outs, plain_outs) -> None:
    """The same tokens and their logprobs within 1e-4 (the fused kernels sum in another
    order)."""
    for f, p in zip(fused_outs, plain_outs, strict=True):
        assert f.outputs[0].token_ids == p.outputs[0].token_ids
        for lf, lp in zip(f.outputs[0].logprobs, p.outputs[0].logprobs, strict=True):
            assert lf.token_id == lp.token_id and abs(lf.logprob - lp.logprob) < 1e-4


def _params(sampling: str, count: int, max_tokens: int):
    """One greedy SamplingParams, or ("mixed") seeded sampling with top-k, top-p, min-p and
    penalties, one kind per request (tests/decode_path.py)."""
    from tests.decode_path import mixed_sampling

    if sampling == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                              logprobs=1)
    return mixed_sampling(count + 1)[1:]  # the four sampled kinds


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_small_batches_give_the_unfused_tokens(tiny_model, fused_everywhere,
                                                       monkeypatch, sampling):
    """Decoding 1 to 4 requests (decode steps of <= 4 rows run the fused path; the prefill
    steps, larger, do not) gives the tokens and nearly the logprobs of the modules, greedy and
    with seeded sampling (top-k, top-p, min-p, penalties)."""
    from pagedrt.entrypoints.llm import LLM
    from tests.tiny_model import build_tiny_llama

    model = build_tiny_llama(seed=0)
    _perturbed_norms(model.model)
    prompts = [[5, 9, 200, 17], [1, 2, 3], [300, 301, 7, 8, 9, 10], [42]]
    llm = LLM(model, num_kv_blocks=64, block_size=8)
    for count in (1, 4):
        params = _params(sampling, count, 12)
        _assert_fused_gives_the_plain_tokens(llm, prompts[:count], params, monkeypatch)
    assert {"rmsnorm", "silu_mul"} <= set(fused_everywhere)


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_batch_one_with_the_one_row_kernel_gives_the_unfused_tokens(
        tiny_model, monkeypatch, sampling):
    """One request: every fused op at one row runs the one-row kernel (`row_configs`' last
    config for its K, so that a program walks several blocks), the decode steps give the
    modules' tokens and nearly their logprobs."""
    from pagedrt.entrypoints.llm import LLM
    from tests.tiny_model import build_tiny_llama

    used = []

    def row_fused(key, unfused, fused, weight, rows, *_, **__):
        if rows != 1:
            return unfused()
        config = gemv_triton.row_configs(weight.shape[1], 1)[-1]
        used.append((key[0], config))
        return fused(config)

    monkeypatch.setattr(layers, "_small_batch_fusion",
                        lambda x, *w: x.dim() == 2 and x.shape[0] <= MAX_ROWS)
    monkeypatch.setattr(gemv_triton, "fused_or_unfused", row_fused)
    model = build_tiny_llama(seed=0)
    _perturbed_norms(model.model)
    llm = LLM(model, num_kv_blocks=64, block_size=8)
    _assert_fused_gives_the_plain_tokens(llm, [[5, 9, 200, 17]], _params(sampling, 1, 12),
                                         monkeypatch)
    assert {name for name, _ in used} >= {"rmsnorm", "silu_mul"}
    assert all(len(config) == 4 for _, config in used)


def test_row_parallel_down_projection_keeps_the_chain_under_tensor_parallelism(monkeypatch):
    """With tp_size > 1 the fused SiLU down projection is never timed (both candidates end in
    the all-reduce, which the ranks would run different numbers of times): the plain chain
    runs, and its all-reduce once."""
    from pagedrt.distributed.group import TPGroup
    from pagedrt.models.layers import RowParallelLinear

    class CountingGroup(TPGroup):
        def all_reduce(self, x):
            reduced.append(x.shape)
            return x

    reduced, timed = [], []
    monkeypatch.setattr(layers, "_small_batch_fusion", lambda x, *w: True)
    monkeypatch.setattr(gemv_triton, "fused_or_unfused", lambda *a: timed.append(a))
    down = RowParallelLinear(32, 8, tp=CountingGroup(rank=0, size=2))
    torch.nn.init.normal_(down.weight)
    x = torch.randn(2, 32)  # [M, 2 * (32 / 2)]: gate | up of this rank
    y = down.forward_silu_mul(x, SiluAndMul())
    torch.testing.assert_close(y, torch.nn.functional.linear(SiluAndMul()(x), down.weight))
    assert timed == [] and len(reduced) == 1


@pytest.mark.parametrize("heads", [(6, 6), (6, 2), (8, 1)], ids=["mha", "gqa3", "gqa8"])
@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("k,config", [(40, (4, 16, 4)), (300, (32, 128, 4))],
                         ids=["k40", "k300"])
def test_qkv_rope_matches_the_chain(m, heads, k, config):
    """QKV with RoPE and the K/V write in the epilogue (`qkv_rope_triton`) against the plain
    chain (the skinny matmul, with the RMSNorm prologue or without, then
    `rotary_write_kv_triton`): GQA ratios 1, 3 and 8, fp32 and fp16, a bias, a padding row
    (slot -1), slots at a block's first and last token; the qkv rows, both caches, the new
    residual. K 40: all of W's columns loaded before the PDL wait; K 300 at (32, 128, 4): the
    first 128 at the default 64 values per thread (`pre_wait_columns`), then the K loop."""
    from pagedrt.ops.fused_triton import rotary_write_kv_triton
    from pagedrt.ops.gemv_rope_triton import qkv_rope_triton

    num_heads, num_kv_heads = heads
    d, block_size = 16, 8
    n = (num_heads + 2 * num_kv_heads) * d
    g = torch.Generator().manual_seed(m * 10 + num_kv_heads)
    for dtype, norm_mode in ((torch.float32, "residual"), (torch.float16, "none"),
                             (torch.float32, "norm")):
        x = torch.randn(m, k, generator=g).to(dtype)
        w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
        b = torch.randn(n, generator=g).to(dtype)
        residual = torch.randn(m, k, generator=g).to(dtype) if norm_mode == "residual" else None
        norm_w = (1 + 0.3 * torch.randn(k, generator=g)).to(dtype)
        positions = torch.randint(0, 60, (m,), generator=g)
        cos_sin = torch.randn(64, d, generator=g)
        slots = torch.tensor([7, 8, -1, 31][:m])  # last and first of a block, padding
        caches = [torch.zeros(4, block_size, num_kv_heads, d, dtype=dtype) for _ in range(4)]
        norm = None if norm_mode == "none" else (residual, norm_w, 1e-6)
        got, got_res = qkv_rope_triton(x, w, b, positions, cos_sin, caches[0], caches[1],
                                       slots, num_heads, num_kv_heads, norm, config)
        if norm is None:
            want, want_res = gemv_triton.gemv_triton(x, w, b, (8, 16, 4)), None
        else:
            want, want_res = gemv_rmsnorm_triton(x, residual, norm_w, 1e-6, w, b, (8, 16, 4))
        q, kk, v = want.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
        rotary_write_kv_triton(positions, q.view(m, num_heads, d), kk.view(m, num_kv_heads, d),
                               v.view(m, num_kv_heads, d), cos_sin, caches[2], caches[3], slots)
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        torch.testing.assert_close(caches[0], caches[2], rtol=tol, atol=tol)
        torch.testing.assert_close(caches[1], caches[3], rtol=tol, atol=tol)
        assert (got_res is None) == (want_res is None)
        if want_res is not None:
            assert torch.equal(got_res, want_res)


def test_pre_wait_columns(monkeypatch):
    """W's columns the 1-4-row kernels load before the PDL wait: a power of two, K's at most
    (rounded up), PRE_WAIT_VALUES_PER_THREAD values per thread (the default 64 here, whatever
    PAGEDRT_GEMV_PRE_VALUES says), none under 16."""
    monkeypatch.setattr(gemv_triton, "PRE_WAIT_VALUES_PER_THREAD", 64)
    pre = gemv_triton.pre_wait_columns
    per_thread = gemv_triton.PRE_WAIT_VALUES_PER_THREAD
    assert pre(4, 896, 4) == 1024  # all of a Qwen2-0.5B row: 4 x 1024 <= 64 x 128
    assert pre(4, 4864, 4) == 2048  # the down projection: the first 2,048 of 4,864
    assert pre(64, 300, 4) == 128  # qkv_rope_triton at (32, 128, 4): 2 x 32 rows
    assert pre(8, 40, 4) == 64
    assert pre(4096, 896, 1) == 0  # under 16 columns: none
    for rows, k, warps in ((4, 896, 4), (64, 4096, 8), (16, 100, 4), (2, 5000, 1)):
        cols = pre(rows, k, warps)
        assert cols & (cols - 1) == 0 and cols <= max(16, 2 * k)
        assert rows * cols <= per_thread * 32 * warps


def test_fused_margin_from_the_environment(monkeypatch):
    monkeypatch.delenv("PAGEDRT_FUSED_MARGIN", raising=False)
    assert gemv_triton.fused_margin() == 1.0
    monkeypatch.setenv("PAGEDRT_FUSED_MARGIN", "0.95")
    assert gemv_triton.fused_margin() == 0.95
    for bad in ("0", "-1", "3", "fast", "nan"):
        monkeypatch.setenv("PAGEDRT_FUSED_MARGIN", bad)
        with pytest.raises(ValueError, match=f"PAGEDRT_FUSED_MARGIN='{bad}'.*\\(0, 2\\]"):
            gemv_triton.fused_margin()


def test_fused_ops_are_timed_with_the_margin(monkeypatch):
    """fused_or_unfused hands PAGEDRT_FUSED_MARGIN to the timing as the baseline's margin and
    runs what it chose."""
    seen = []

    def timing(baseline, candidate, configs, rep, record=None, baseline_margin=0.95):
        seen.append(baseline_margin)
        return "cfg"

    monkeypatch.setattr(gemv_triton, "fastest_config", timing)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # CPU build
    monkeypatch.setenv("PAGEDRT_FUSED_MARGIN", "0.9")
    key = ("test-only", 1)
    monkeypatch.setitem(gemv_triton._FUSED_CHOICE, key, None)  # restored (removed) after
    del gemv_triton._FUSED_CHOICE[key]
    out = gemv_triton.fused_or_unfused(key, lambda: "chain", lambda cfg: f"fused {cfg}",
                                       torch.zeros(8, 8), 1, False)
    assert (out, seen) == ("fused cfg", [0.9])


def test_pre_wait_values_from_the_environment():
    """PAGEDRT_GEMV_PRE_VALUES: unset 64, a power of two from 16 to 512, or 0 (none); anything
    else a ValueError naming the value."""
    parse = gemv_triton._pre_wait_values
    assert parse(None) == 64 and parse("128") == 128 and parse("16") == 16 and parse("0") == 0
    for bad in ("100", "8", "1024", "-64", "lots", ""):
        with pytest.raises(ValueError, match="PAGEDRT_GEMV_PRE_VALUES"):
            parse(bad)


def test_qkv_rope_bad_inputs():
    from pagedrt.ops.gemv_rope_triton import qkv_rope_triton

    x, w = torch.randn(2, 16), torch.randn(64, 16)  # 2 + 2 x 1 heads of 16
    cs, pos = torch.randn(8, 16), torch.zeros(2, dtype=torch.long)
    slots = torch.zeros(2, dtype=torch.long)
    cache = torch.zeros(2, 4, 1, 16)
    with pytest.raises(ValueError, match="heads of 16"):
        qkv_rope_triton(x, w, None, pos, cs, cache, cache, slots, 3, 1)
    with pytest.raises(ValueError, match="k_cache"):
        qkv_rope_triton(x, w, None, pos, cs, torch.zeros(2, 4, 2, 16), cache, slots, 2, 1)
    with pytest.raises(ValueError, match="v_cache"):
        qkv_rope_triton(x, w, None, pos, cs, cache, cache.half(), slots, 2, 1)
    with pytest.raises(ValueError, match="slot_mapping"):
        qkv_rope_triton(x, w, None, pos, cs, cache, cache, slots[:1], 2, 1)


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_with_rope_in_the_qkv_kernel_gives_the_unfused_tokens(tiny_model,
                                                                     fused_everywhere,
                                                                     monkeypatch, sampling):
    """PAGEDRT_FUSED_ROPE (the default): decode steps of 1-4 rows run the norm, QKV, RoPE and
    the K/V write in one kernel; tokens and logprobs as the plain modules', greedy and with
    seeded sampling."""
    from pagedrt.entrypoints.llm import LLM
    from pagedrt.models import llama
    from pagedrt.ops import gemv_rope_triton
    from tests.tiny_model import build_tiny_llama

    monkeypatch.setattr(gemv_rope_triton, "ENABLED", True)
    monkeypatch.setattr(llama, "uses_triton", lambda backend, x: True)
    model = build_tiny_llama(seed=0)
    _perturbed_norms(model.model)
    prompts = [[5, 9, 200, 17], [1, 2, 3], [300, 301, 7, 8, 9, 10], [42]]
    llm = LLM(model, num_kv_blocks=64, block_size=8)
    for count in (4,):  # 4 decode rows (one row: test_qkv_rope_matches_the_chain)
        params = _params(sampling, count, 8)
        _assert_fused_gives_the_plain_tokens(llm, prompts[:count], params, monkeypatch)
    assert "qkv_rope" in fused_everywhere
