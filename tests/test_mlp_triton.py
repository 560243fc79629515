"""The whole small-batch MLP in one kernel (pagedrt/ops/mlp_triton.py: residual add, RMSNorm,
gate/up, SiLU-and-mul, down with its split-K partials summed in two levels) against the torch
modules it replaces, under the Triton interpreter on CPU; and the decoder's tokens through it
on the tiny model."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch.nn.functional as F

from pagedrt.models import layers
from pagedrt.models.layers import RMSNorm, SiluAndMul
from pagedrt.ops import gemv_triton, mlp_triton
from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.gemv_triton import MAX_ROWS
from pagedrt.ops.mlp_triton import CONFIGS, groups_of
from pagedrt.ops.mlp_triton import mlp_triton as fused_mlp
from pagedrt.sampling_params import SamplingParams


def _weights(h: int, inter: int, g: torch.Generator, dtype=torch.float32):
    """(norm, gate_up [2I, H], down [H, I]): a norm with weights 1 + 0.3 N(0, 1), matmul
    weights N(0, 1 / fan_in)."""
    norm = RMSNorm(h, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.3 * torch.randn(h, generator=g))
    gate_up = torch.randn(2 * inter, h, generator=g) / h ** 0.5
    down = torch.randn(h, inter, generator=g) / inter ** 0.5
    return norm.to(dtype), gate_up.to(dtype), down.to(dtype)


def _chain(norm, x, residual, gate_up, down):
    """The modules' MLP: (down(silu(gate) * up) of gate_up(norm(x + residual)), x + residual)."""
    h, new_residual = norm.forward_pair(x, residual)
    return F.linear(SiluAndMul()(F.linear(h, gate_up)), down), new_residual


# (H, I, config): one program (I <= BLOCK_I: one group of one); I not a multiple of BLOCK_I
# with groups of unequal size (5 programs: groups of 2, 2 and 1); H not a power of two, over
# several down tiles and gate/up steps after the pre-wait columns, with the tiles loaded a
# step ahead and without; 63 programs in 8 groups
SHAPES = [(64, 16, (32, 128, 128, 4, 0)), (96, 150, (32, 128, 64, 4, 1)),
          (300, 80, (16, 64, 128, 4, 0)), (300, 80, (16, 64, 128, 4, 1)),
          (40, 1000, (16, 256, 256, 4, 0))]


@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("h,inter,config", SHAPES,
                         ids=[f"h{h}i{i}a{c[4]}" for h, i, c in SHAPES])
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "no_residual"])
def test_matches_the_module_chain(m, h, inter, config, with_residual):
    """fp32: the output within 1e-5 of the modules (the sums run in another order), the new
    residual exactly x + residual; the arrival counters left at 0 for the next launch."""
    g = torch.Generator().manual_seed(m * 1000 + h + inter)
    norm, gate_up, down = _weights(h, inter, g)
    x = torch.randn(m, h, generator=g)
    residual = torch.randn(m, h, generator=g) if with_residual else None
    y, new_residual = fused_mlp(x, residual, norm.weight.data, norm.eps, gate_up, down, config)
    want, want_residual = _chain(norm, x, residual, gate_up, down)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    if with_residual:
        assert torch.equal(new_residual, want_residual)
    else:
        assert new_residual is None
    assert int(arrival_counters(x.device, 1).abs().sum()) == 0


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_every_config_of_record(config):
    """Each tile config the engine times, at a Qwen2-like ratio of H to I (I = 5.4 H), 2 rows
    and strided x (a slice of a wider buffer)."""
    g = torch.Generator().manual_seed(sum(config))
    h, inter = 128, 688
    norm, gate_up, down = _weights(h, inter, g)
    x = torch.randn(2, 3 * h, generator=g)[:, h: 2 * h]
    residual = torch.randn(2, h, generator=g)
    y, _ = fused_mlp(x, residual, norm.weight.data, norm.eps, gate_up, down, config)
    torch.testing.assert_close(y, _chain(norm, x, residual, gate_up, down)[0], rtol=1e-5,
                               atol=1e-5)


def test_half_precision_rounds_where_the_modules_round():
    """bf16: the residual sum within one bf16 step (the interpreter's fp32 -> bf16 cast
    truncates where the GPU rounds to nearest) and the output within a few bf16 ulps of the
    modules' chain, which rounds gate/up's output, the activation and the product to bf16."""
    g = torch.Generator().manual_seed(5)
    norm, gate_up, down = _weights(128, 320, g, torch.bfloat16)
    x = torch.randn(3, 128, generator=g).to(torch.bfloat16)
    residual = torch.randn(3, 128, generator=g).to(torch.bfloat16)
    y, new_residual = fused_mlp(x, residual, norm.weight.data, norm.eps, gate_up, down,
                                (32, 128, 128, 4, 1))
    want, want_residual = _chain(norm, x, residual, gate_up, down)
    torch.testing.assert_close(new_residual.float(), want_residual.float(), rtol=2**-7, atol=0)
    torch.testing.assert_close(y.float(), want.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("programs", [1, 2, 3, 5, 16, 17, 63, 64, 152, 304, 448, 1000])
def test_groups_cover_the_programs_in_few_reads(programs):
    """GROUP is a power of two; the groups cover every program, none empty; neither level
    reads more than about twice the square root of the program count."""
    group, num_groups = groups_of(programs)
    assert group & (group - 1) == 0
    assert (num_groups - 1) * group < programs <= num_groups * group
    assert max(group, num_groups) <= 2 * programs ** 0.5 + 1


def test_bad_inputs_name_what_does_not_fit():
    g = torch.Generator().manual_seed(0)
    norm, gate_up, down = _weights(16, 24, g)
    nw, x = norm.weight.data, torch.randn(2, 16)
    with pytest.raises(ValueError, match="M in 1..4"):
        fused_mlp(torch.randn(5, 16), None, nw, 1e-6, gate_up, down)
    with pytest.raises(ValueError, match=r"gate_up_weight \(47, 16\)"):
        fused_mlp(x, None, nw, 1e-6, gate_up[:47], down)
    with pytest.raises(ValueError, match=r"down_weight \(16, 23\) must be \[H, I\] = \(16, 24\)"):
        fused_mlp(x, None, nw, 1e-6, gate_up, down[:, :23].contiguous())
    with pytest.raises(ValueError, match="norm_weight"):
        fused_mlp(x, None, torch.ones(15), 1e-6, gate_up, down)
    with pytest.raises(ValueError, match="residual"):
        fused_mlp(x, torch.randn(3, 16), nw, 1e-6, gate_up, down)
    with pytest.raises(ValueError, match="must match"):
        fused_mlp(x, None, nw, 1e-6, gate_up.double(), down)
    with pytest.raises(ValueError, match="contiguous"):
        fused_mlp(x, None, nw, 1e-6, gate_up, down.t().contiguous().t())


@pytest.fixture
def whole_mlp_everywhere(monkeypatch):
    """The layers take every small-batch fused path on CPU tensors (the interpreter runs the
    kernels), the whole-MLP kernel with one config; counts the fused calls by op."""
    calls = []

    def always_fused(key, unfused, fused, *_, candidates=None, **__):
        calls.append(key[0])
        return fused((16, 64, 64, 4, 1) if key[0] == "mlp" else (8, 128, 4))

    monkeypatch.setattr(layers, "_small_batch_fusion",
                        lambda x, *w: x.dim() == 2 and x.shape[0] <= MAX_ROWS)
    monkeypatch.setattr(gemv_triton, "fused_or_unfused", always_fused)
    monkeypatch.setattr(mlp_triton, "ENABLED", True)  # (PAGEDRT_FUSED_MLP, opt-in)
    return calls


@pytest.mark.parametrize("sampling", ["greedy", "mixed"])
def test_decoder_small_batches_give_the_unfused_tokens(whole_mlp_everywhere, monkeypatch,
                                                       sampling):
    """Decoding 1 and 4 requests with the whole MLP in one kernel gives the tokens and nearly
    the logprobs of the plain modules, greedy and with seeded sampling (top-k, top-p, min-p,
    penalties)."""
    from pagedrt.entrypoints.llm import LLM
    from tests.decode_path import mixed_sampling
    from tests.tiny_model import build_tiny_llama, perturb_norms

    model = perturb_norms(build_tiny_llama(seed=0), torch.Generator().manual_seed(11))
    prompts = [[5, 9, 200, 17], [1, 2, 3], [300, 301, 7, 8, 9, 10], [42]]
    llm = LLM(model, num_kv_blocks=64, block_size=8)
    for count in (1, 4):
        params = (SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
                  if sampling == "greedy" else mixed_sampling(count + 1)[1:])
        fused_outs = llm.generate(prompts[:count], params, use_tqdm=False)
        with monkeypatch.context() as mp:
            mp.setattr(layers, "_small_batch_fusion", lambda x, *w: False)
            plain_outs = llm.generate(prompts[:count], params, use_tqdm=False)
        for f, p in zip(fused_outs, plain_outs, strict=True):
            assert f.outputs[0].token_ids == p.outputs[0].token_ids
            for lf, lp in zip(f.outputs[0].logprobs, p.outputs[0].logprobs, strict=True):
                assert lf.token_id == lp.token_id and abs(lf.logprob - lp.logprob) < 1e-4
    assert "mlp" in whole_mlp_everywhere
    assert "silu_mul" not in whole_mlp_everywhere  # the whole MLP replaced the chain


def test_switched_off_keeps_the_chain(whole_mlp_everywhere, monkeypatch, tiny_model):
    """PAGEDRT_FUSED_MLP=0 (`mlp_triton.ENABLED` False): the chain's fused ops run, the
    whole-MLP kernel never."""
    from pagedrt.entrypoints.llm import LLM

    monkeypatch.setattr(mlp_triton, "ENABLED", False)
    llm = LLM(tiny_model, num_kv_blocks=16, block_size=8)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert "mlp" not in whole_mlp_everywhere and "silu_mul" in whole_mlp_everywhere


def test_tensor_parallel_keeps_the_chain(monkeypatch):
    """Under tensor parallelism the down projection ends in an all-reduce, which a timed op
    must not hold: the MLP keeps the chain."""
    from pagedrt.config import ModelConfig
    from pagedrt.distributed.group import TPGroup
    from pagedrt.models.llama import LlamaMLP

    monkeypatch.setattr(layers, "_small_batch_fusion", lambda x, *w: True)
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=32, hidden_size=16,
                         intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=8)
    monkeypatch.setattr(mlp_triton, "ENABLED", True)
    mlp = LlamaMLP(config, tp=TPGroup(rank=0, size=2))
    norm = RMSNorm(16)
    assert not mlp._whole_mlp_fusion(norm, torch.randn(1, 16))
    assert LlamaMLP(config)._whole_mlp_fusion(norm, torch.randn(1, 16))
