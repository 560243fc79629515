"""GGUF files of the qwen3 and gemma3 architectures: pagedrt's reader (`read_gguf`) against
transformers' own GGUF loader on the same file, fp32 on CPU.

The files are written here from small random HF models with gguf-py's own tensor-name table
(what llama.cpp's converter uses), Gemma 3's norms stored as 1 + w as that converter does. Both
readers then work from the file alone, so a wrong name, a missed norm offset or a misread
window shows up as a logit mismatch. (The real Gemma 3 270M GGUF: test_gemma3_270m.py.)
"""

from __future__ import annotations

import os

import gguf
import pytest
import torch
from test_models import CPU, compare_with_hf
from transformers import AutoConfig, AutoModelForCausalLM, Gemma3TextConfig, Qwen3Config
from transformers import Gemma3ForCausalLM as HFGemma3
from transformers import Qwen3ForCausalLM as HFQwen3
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from pagedrt.models.loader import build_model, read_gguf


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def write_gguf(hf_model: torch.nn.Module, path: str, arch_name: str) -> None:
    """An F32 GGUF of `hf_model` named by gguf-py's tensor map; metadata as llama.cpp writes
    it for `arch_name`."""
    cfg = hf_model.config
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch_name)
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(path, arch=arch_name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
                              ["rope_theta"])
    if arch_name == "gemma3":
        writer.add_sliding_window(cfg.sliding_window)
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = name.rsplit(".", 1)
        array = tensor.float().numpy()
        if arch_name == "gemma3" and base.endswith("norm"):
            array = array + 1.0  # llama.cpp multiplies by the stored weight alone
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def hf_from_gguf(path: str, vocab_size: int) -> torch.nn.Module:
    """transformers' reading of the file (its config parser, dequantiser and name map). The
    file carries no tokenizer, so the vocabulary size is given."""
    folder, name = os.path.split(path)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.vocab_size = vocab_size
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    if "lm_head.weight" in missing:
        model.tie_weights()
    return model.eval()


def _gemma3() -> torch.nn.Module:
    # head_dim 256 as in every Gemma 3: the GGUF has no query_pre_attn_scalar, both readers
    # take 256 / head_dim
    return HFGemma3(Gemma3TextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=256,
        max_position_embeddings=512, sliding_window=24, initializer_range=0.1))


def _qwen3() -> torch.nn.Module:
    # head_dim 128 (unlike hidden / heads = 16): transformers' GGUF parser does not read
    # qwen3.attention.key_length and keeps Qwen3Config's 128; pagedrt reads it
    return HFQwen3(Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=512,
        initializer_range=0.1, tie_word_embeddings=True))


@pytest.mark.parametrize("make, arch_name", [(_gemma3, "gemma3"), (_qwen3, "qwen3")],
                         ids=["gemma3", "qwen3"])
def test_gguf_matches_transformers_gguf_loader(make, arch_name, tmp_path) -> None:
    torch.manual_seed(0)
    source = make().eval()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():  # norms away from their init, so each lands where it must
        for name, p in source.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.6 * torch.rand(p.shape, generator=g) - 0.3)
    path = str(tmp_path / f"tiny-{arch_name}.gguf")
    write_gguf(source, path, arch_name)
    config, tensors = read_gguf(path)
    assert config.architecture == type(source).__name__ and config.qk_norm
    if arch_name == "gemma3":
        assert config.sliding_window == 24 and config.kv_sliding_window is None
        assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
        assert (config.rope_theta, config.rope_local_theta) == (1e6, 1e4)
        assert config.query_pre_attn_scalar == 256
    model = build_model(config, torch.float32, CPU)
    model.load_weights(tensors.items())
    hf_model = hf_from_gguf(path, config.vocab_size)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (40, 5)]
    compare_with_hf(model.eval(), hf_model, prompts, num_decode_steps=8)
