"""The whole 1-4-row MLP in one kernel on CUDA (pagedrt/ops/mlp_triton.py): against the
modules in bf16 at the Qwen2-0.5B and Llama-3-8B shapes with every config; the same bits on
every launch and every CUDA-graph replay (its split-K partials are summed in a fixed order
whichever program arrives last, and it leaves its arrival counters at 0); and the engine's
greedy tokens through it against the plain modules (CUDA graphs on, batches of 1 to 4)."""

import pytest
import torch
import torch.nn.functional as F
from forced_op import greedy_tokens_forcing
from tiny_model import build_tiny_llama, perturb_norms

from pagedrt.models import layers
from pagedrt.models.layers import RMSNorm, SiluAndMul
from pagedrt.ops import mlp_triton as mlp_module
from pagedrt.ops.arrival_counters import arrival_counters
from pagedrt.ops.mlp_triton import CONFIGS, mlp_triton

SHAPES = {"qwen2": (896, 4864), "llama3": (4096, 14336)}  # (hidden, intermediate)


def _inputs(hidden: int, inter: int, m: int):
    g = torch.Generator(device="cuda").manual_seed(m + hidden)
    dev, bf16 = "cuda", torch.bfloat16
    norm = RMSNorm(hidden, 1e-6).to(dev, bf16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(hidden, device=dev, generator=g))
    x = torch.randn(m, hidden, device=dev, generator=g).to(bf16)
    residual = torch.randn(m, hidden, device=dev, generator=g).to(bf16)
    gate_up = (torch.randn(2 * inter, hidden, device=dev, generator=g) / hidden ** 0.5).to(bf16)
    down = (torch.randn(hidden, inter, device=dev, generator=g) / inter ** 0.5).to(bf16)
    return norm, x, residual, gate_up, down


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 4])
def test_matches_the_modules_in_bf16(model, m):
    norm, x, residual, gate_up, down = _inputs(*SHAPES[model], m)
    h, want_residual = norm(x, residual)
    want = F.linear(SiluAndMul()(F.linear(h, gate_up)), down).float()
    for cfg in CONFIGS:
        y, new_residual = mlp_triton(x, residual, norm.weight, norm.eps, gate_up, down, cfg)
        assert torch.equal(new_residual, want_residual)  # the GPU rounds as torch does
        torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)
    assert int(arrival_counters(x.device, 1).abs().sum()) == 0


@pytest.mark.parametrize("m", [1, 4])
def test_same_bits_on_every_launch_and_replay(m):
    """Ten eager launches and ten replays of a captured one give the same bits: the partials'
    sum does not follow the order in which the programs finish."""
    norm, x, residual, gate_up, down = _inputs(*SHAPES["qwen2"], m)
    cfg = CONFIGS[1]

    def run():
        return mlp_triton(x, residual, norm.weight, norm.eps, gate_up, down, cfg)[0]

    first = run()
    for _ in range(10):
        assert torch.equal(run(), first)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for _ in range(10):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, first)
    assert int(arrival_counters(x.device, 1).abs().sum()) == 0


def test_engine_tokens_through_the_whole_mlp(monkeypatch):
    """fp32 tiny model with perturbed norms: with the whole-MLP kernel forced for every 1-4-row
    MLP (inside the CUDA graphs), the greedy tokens of 1 and 4 requests are the plain
    modules'."""
    loaded = perturb_norms(build_tiny_llama(seed=0), torch.Generator().manual_seed(11))
    loaded = loaded._replace(model=loaded.model.to("cuda"))
    on = [(mlp_module, "ENABLED", True)]  # (PAGEDRT_FUSED_MLP, opt-in)
    fused, forced = greedy_tokens_forcing(monkeypatch, loaded, "mlp", CONFIGS[1], on)
    plain, _ = greedy_tokens_forcing(monkeypatch, loaded, "mlp", CONFIGS[1],
                                     on + [(layers, "SMALL_BATCH_FUSION", False)])
    assert forced, "the whole-MLP path never ran"
    assert fused == plain
