"""Models with sliding-window attention (Mistral, Qwen3 with windowed layers, Gemma 3) against
Hugging Face transformers on the same random weights, fp32 on CPU: logits at every prefill
position and over 32 decode steps, and greedy tokens through the engine in a mixed batch whose
prompts are longer than the window.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_models import BLOCK_SIZE, CPU, compare_with_hf
from transformers import Gemma3ForCausalLM as HFGemma3
from transformers import Gemma3TextConfig, MistralConfig, Qwen3Config
from transformers import MistralForCausalLM as HFMistral
from transformers import Qwen3ForCausalLM as HFQwen3

from pagedrt import LLM, SamplingParams
from pagedrt.config import ModelConfig
from pagedrt.models.loader import load_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _tiny_mistral(window: int) -> torch.nn.Module:
    return HFMistral(MistralConfig(
        vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.1, sliding_window=window,
    ))


def _tiny_qwen3_windowed(window: int) -> torch.nn.Module:
    """Layer 0 full, layer 1 sliding (use_sliding_window, max_window_layers=1)."""
    return HFQwen3(Qwen3Config(
        vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        initializer_range=0.1, tie_word_embeddings=True, use_sliding_window=True,
        sliding_window=window, max_window_layers=1,
    ))


def _tiny_gemma3(window: int, layer_types=None, **overrides) -> torch.nn.Module:
    """Three local layers then a global one; query_pre_attn_scalar unlike head_dim, linear
    RoPE scaling on the global layer, and random (1 + w) norm weights (HF starts them at 0)."""
    config = Gemma3TextConfig(**{
        "vocab_size": 500, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "max_position_embeddings": 512, "initializer_range": 0.1, "sliding_window": window,
        "layer_types": layer_types or ["sliding_attention"] * 3 + ["full_attention"],
        "query_pre_attn_scalar": 24, "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}},
        **overrides})
    model = HFGemma3(config)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.6 * torch.rand(p.shape, generator=g) - 0.3)
    return model


MODELS = [
    pytest.param(lambda: _tiny_mistral(20), id="mistral-window20"),
    pytest.param(lambda: _tiny_qwen3_windowed(16), id="qwen3-layer1-window16"),
    pytest.param(lambda: _tiny_gemma3(19), id="gemma3-window19"),
]


@pytest.mark.parametrize("make", MODELS)
def test_windowed_folder_matches_transformers(make, tmp_path) -> None:
    """Prefill of prompts of 70 and 5 tokens (the window cuts the first, mid-block), then 32
    decode steps, against HF: every position within 1e-4 relative."""
    torch.manual_seed(0)
    hf_model = make().eval()
    hf_model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), torch.float32, CPU)
    cfg = loaded.model_config
    assert cfg.architecture == type(hf_model).__name__
    assert cfg.sliding_window == hf_model.config.sliding_window
    assert cfg.layer_types == tuple(getattr(hf_model.config, "layer_types", None)
                                    or ["sliding_attention"] * cfg.num_hidden_layers)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (70, 5)]
    compare_with_hf(loaded.model, hf_model, prompts, num_decode_steps=32)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: _tiny_mistral(32), id="mistral"),
    pytest.param(lambda: _tiny_gemma3(32), id="gemma3"),
])
def test_llm_generate_with_window_matches_hf_generate(make, tmp_path) -> None:
    """Window 32, prompts of 70 and 150 tokens in one batch, 40 new tokens each: the same
    greedy tokens as HF `generate`, prompt by prompt. Mistral windows every layer, so blocks
    leave the cache as the window moves: at the end every block is free again."""
    torch.manual_seed(0)
    hf_model = make().eval()
    hf_model.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu", block_size=BLOCK_SIZE,
              num_kv_blocks=40)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (70, 150)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    engine = llm.llm_engine
    assert llm.stats()["peak_batch_size"] == 2
    for prompt, out in zip(prompts, outputs, strict=True):
        hf = hf_model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=40, min_new_tokens=40, do_sample=False, pad_token_id=0,
        )
        assert out.outputs[0].token_ids == hf[0, len(prompt):].tolist()
    engine.check_integrity()
    kv = engine.kv_manager
    assert kv.pool.num_free_blocks == kv.num_blocks
    windowed = isinstance(hf_model, HFMistral)
    assert kv.sliding_window == (32 if windowed else None)
    # both prompts prefilled in one step: 5 + 10 blocks; then Mistral holds at most 3 per
    # sequence, while Gemma 3's global layer keeps all 7 + 12 of 110 and 190 tokens
    assert llm.stats()["peak_used_blocks"] == (15 if windowed else 19)


def test_window_config_reading(tmp_path) -> None:
    """Which layers HF windows, read from config.json: Mistral all of them (unless the window
    covers every position), Qwen only with use_sliding_window, Gemma 3 by layer_types or the
    older sliding_window_pattern."""
    _tiny_mistral(64).save_pretrained(tmp_path)
    mistral = json.loads((tmp_path / "config.json").read_text())
    cfg = ModelConfig.from_hf_config(mistral)
    assert cfg.sliding_window == 64 and cfg.kv_sliding_window == 64
    assert cfg.layer_types == ("sliding_attention",) * 2
    for window in (512, None):  # >= max_position_embeddings, or none: full attention
        cfg = ModelConfig.from_hf_config({**mistral, "sliding_window": window})
        assert cfg.sliding_window is None and cfg.layer_types == () and not cfg.kv_sliding_window

    qwen = Qwen3Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=64,
                       max_window_layers=2, architectures=["Qwen3ForCausalLM"]).to_dict()
    cfg = ModelConfig.from_hf_config(qwen)
    assert cfg.layer_types == ("full_attention",) * 2 + ("sliding_attention",) * 2
    assert cfg.layer_sliding_window(1) is None and cfg.layer_sliding_window(3) == 64
    assert cfg.kv_sliding_window is None  # mixed: every block stays
    legacy = {k: v for k, v in qwen.items() if k != "layer_types"}  # older config.json
    assert ModelConfig.from_hf_config(legacy).layer_types == cfg.layer_types
    assert ModelConfig.from_hf_config({**legacy, "use_sliding_window": False}).layer_types == ()

    gemma = {**Gemma3TextConfig(num_hidden_layers=8).to_dict(),
             "architectures": ["Gemma3ForCausalLM"]}
    cfg = ModelConfig.from_hf_config(gemma)
    expected = ("sliding_attention",) * 5 + ("full_attention",) + ("sliding_attention",) * 2
    assert cfg.layer_types == expected and cfg.sliding_window == 4096
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.query_pre_attn_scalar) == (1e6, 1e4, 256)
    assert cfg.qk_norm and cfg.tie_word_embeddings
    old = {k: v for k, v in gemma.items() if k not in ("layer_types", "rope_parameters")}
    old.update(sliding_window_pattern=3, rope_theta=5e5, rope_local_base_freq=2e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0})
    cfg = ModelConfig.from_hf_config(old)
    assert cfg.layer_types == ("sliding_attention",) * 2 + ("full_attention",) + (
        "sliding_attention",) * 2 + ("full_attention",) + ("sliding_attention",) * 2
    assert (cfg.rope_theta, cfg.rope_local_theta) == (5e5, 2e4)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 8.0}


@pytest.mark.parametrize("field, value, match", [
    ("final_logit_softcapping", 30.0, "soft-capping"),
    ("attn_logit_softcapping", 50.0, "soft-capping"),
    ("use_bidirectional_attention", True, "causal"),
    ("hidden_activation", "relu", "gelu_pytorch_tanh"),
])
def test_gemma3_config_refusals(field, value, match) -> None:
    gemma = {**Gemma3TextConfig(num_hidden_layers=2).to_dict(),
             "architectures": ["Gemma3ForCausalLM"], field: value}
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_config(gemma)


def test_model_config_window_errors() -> None:
    base = {"architecture": "MistralForCausalLM", "vocab_size": 8, "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": 8}
    with pytest.raises(ValueError, match="one of .* per layer"):
        ModelConfig(**base, sliding_window=4, layer_types=("sliding_attention",))
    with pytest.raises(ValueError, match="sliding_window is None"):
        ModelConfig(**base, layer_types=("sliding_attention",) * 2)
    with pytest.raises(ValueError, match="sliding_window=0"):
        ModelConfig(**base, sliding_window=0, layer_types=("sliding_attention",) * 2)


@pytest.mark.parametrize("name, hf_class", [("mistral-7b", "MistralConfig"),
                                             ("gemma3-1b", "Gemma3TextConfig")])
def test_windowed_presets_read_back_and_have_a_matching_hf_twin(name, hf_class) -> None:
    """The preset written as its family's config.json reads back to itself; shrunk (two
    layers, a 9-token window), the benchmarks' HF twin (`hf_model_like`) of the random model
    gives the same logits."""
    import dataclasses

    import transformers

    from pagedrt.bench.common import hf_config_fields, hf_model_like
    from pagedrt.bench.presets import get_preset, random_model

    p = get_preset(name)
    hf_cfg = getattr(transformers, hf_class)(**hf_config_fields(p))
    assert ModelConfig.from_hf_config(hf_cfg.to_dict()) == p
    gemma = p.architecture == "Gemma3ForCausalLM"
    small = dataclasses.replace(
        p, vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=9,
        max_position_embeddings=256,
        layer_types=("sliding_attention", "full_attention" if gemma else "sliding_attention"))
    torch.manual_seed(0)
    loaded = random_model(small, torch.float32, CPU)
    with torch.no_grad():  # N(0, 0.02) weights give near-flat logits: sharpen them
        for n, param in loaded.model.named_parameters():
            if "norm" not in n:
                param.mul_(5.0)
    hf_model = hf_model_like(loaded, torch.float32, CPU, "eager")
    compare_with_hf(loaded.model, hf_model, [list(range(3, 40)), [7, 1, 2]], num_decode_steps=4)


def test_gemma3_windowed_tensor_parallel_matches_one_rank(monkeypatch) -> None:
    """Gemma 3 (a local layer with a 12-token window, a global one) over 2 worker processes:
    the logits of one rank at every position and decode step, and the same greedy tokens."""
    import dataclasses

    from test_tensor_parallel import assert_logits_match
    from tiny_model import TINY_CONFIG, build_tiny_llama

    monkeypatch.setenv("PAGEDRT_NUM_THREADS", "1")  # inherited by the spawned workers
    config = dataclasses.replace(
        TINY_CONFIG, architecture="Gemma3ForCausalLM", qk_norm=True, sliding_window=12,
        layer_types=("sliding_attention", "full_attention"), rope_local_theta=10000.0,
        rope_theta=1e6, query_pre_attn_scalar=16, tie_word_embeddings=True)
    loaded = build_tiny_llama(seed=3, config=config)
    prompts = [[3], list(range(5, 21)), list(range(40, 73))]
    ref = LLM(loaded, num_kv_blocks=64, block_size=8)
    llm = LLM(loaded, tensor_parallel_size=2, num_kv_blocks=64, block_size=8)
    try:
        assert_logits_match(llm, ref, prompts)
        params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
        expected = [o.outputs[0].token_ids for o in ref.generate(prompts, params,
                                                                 use_tqdm=False)]
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                             use_tqdm=False)] == expected
    finally:
        llm.llm_engine.shutdown()
