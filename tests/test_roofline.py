"""The honest roofline (pagedrt/bench/roofline.py): parameter counts against built models, the
formula on cases small enough to count by hand, and the properties the formula promises."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_model import TINY_CONFIG

from pagedrt.bench.presets import PRESETS
from pagedrt.bench.roofline import RooflineModel, roofline_floor
from pagedrt.models.loader import build_model

CEIL = {"read_bytes_per_s": 1e12, "matmul_flop_per_s": 1e15}


@pytest.mark.parametrize("config", [
    TINY_CONFIG,
    dataclasses.replace(TINY_CONFIG, architecture="Qwen2ForCausalLM", attention_bias=True),
    dataclasses.replace(TINY_CONFIG, architecture="Qwen3ForCausalLM", qk_norm=True),
    dataclasses.replace(TINY_CONFIG, tie_word_embeddings=True),
])
def test_counts_from_config_equal_those_of_the_built_model(config):
    model = build_model(config, torch.float32, torch.device("meta"))
    assert RooflineModel.from_config(config) == RooflineModel.from_module(model, config)


def test_qwen2_preset_body_size():
    # Qwen2-0.5B: 494M parameters in all, of which the (tied) 151,936 x 896 embedding is 136M
    m = RooflineModel.from_config(PRESETS["qwen2-0.5b"])
    assert 357e6 < m.body_params < 359e6


def _one_layer(vocab=10, hidden=4, body=100):
    return RooflineModel(body_params=body, vocab_size=vocab, hidden_size=hidden,
                         num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                         head_dim=2)


def test_one_request_by_hand():
    m = _one_layer()
    r = roofline_floor(m, [3], [2], CEIL, weight_bytes=2)
    # step 1: 3 prompt positions, attention pairs 1 + 2 + 3 (4 x d(2) FLOPs each), one LM head
    step1_flops, step1_bytes = 2 * 100 * 3 + 8 * 6 + 2 * 40, 140 * 2
    # step 2: one decode at context 4: body and LM head, 4 pairs; K and V of 4 tokens read
    # (2 x 1 layer x 1 head x 2 dims x 2 bytes = 8 bytes per token)
    step2_flops, step2_bytes = 2 * 140 + 8 * 4, 140 * 2 + 8 * 4
    assert r["flops"] == step1_flops + step2_flops
    assert r["bytes"] == step1_bytes + step2_bytes
    assert r["steps"] == 2 and r["compute_bound_steps"] == 0
    assert r["floor_s"] == pytest.approx(step1_bytes / 1e12 + step2_bytes / 1e12)
    assert r["bound_s"] == pytest.approx(r["bytes"] / 1e12) and r["bound_s"] <= r["floor_s"]


def test_lm_head_counted_only_at_sampled_positions():
    small, big = _one_layer(vocab=10), _one_layer(vocab=1010)
    a = roofline_floor(small, [50, 7], [3, 9], CEIL, 2)
    b = roofline_floor(big, [50, 7], [3, 9], CEIL, 2)
    # 1,000 more vocabulary rows: 2 x 1000 x hidden FLOPs per sampled token (12), not per
    # position (66), and read once per step (9)
    assert b["flops"] - a["flops"] == 2 * 1000 * 4 * 12
    assert b["bytes"] - a["bytes"] == 9 * 1000 * 4 * 2


def test_steps_are_the_longest_output_and_batching_shares_weight_reads():
    m = RooflineModel.from_config(PRESETS["qwen2-0.5b"])
    one = roofline_floor(m, [512], [128], CEIL, 2)
    many = roofline_floor(m, [512] * 256, [128] * 256, CEIL, 2)
    assert many["steps"] == one["steps"] == 128
    assert many["flops"] == 256 * one["flops"]
    weights = 128 * (m.body_params + m.vocab_size * m.hidden_size) * 2
    assert many["bytes"] - weights == 256 * (one["bytes"] - weights)  # K/V reads add up
    # batch 1 only reads weights; 256 prompts of 512 make the first step a compute step
    assert one["compute_bound_steps"] == 0 and many["compute_bound_steps"] >= 1
    # 256 requests share each step's weight reads: far less than 256 times one request's time
    assert one["floor_s"] < many["floor_s"] < 20 * one["floor_s"]


def test_requests_of_different_lengths_leave_the_batch():
    m = _one_layer()
    mixed = roofline_floor(m, [4, 4], [2, 5], CEIL, 2)
    assert mixed["steps"] == 5
    # steps 3..5 decode only the longer request: its four decode steps read the contexts
    # 5, 6, 7, 8; the shorter one's single decode step reads context 5
    assert mixed["bytes"] == 5 * 140 * 2 + 8 * (5 + 6 + 7 + 8) + 8 * 5


def test_fp8_cache_halves_the_kv_bytes():
    m = _one_layer()
    bf16 = roofline_floor(m, [100], [50], CEIL, 2)
    fp8 = roofline_floor(m, [100], [50], CEIL, 2, kv_bytes=1)
    weights = 50 * 140 * 2
    assert (fp8["bytes"] - weights) * 2 == bf16["bytes"] - weights
    assert fp8["flops"] == bf16["flops"]


def test_bad_lengths():
    with pytest.raises(ValueError, match="2 prompt lengths for 1"):
        roofline_floor(_one_layer(), [1, 2], [3], CEIL, 2)
    with pytest.raises(ValueError, match="at least 1"):
        roofline_floor(_one_layer(), [0], [3], CEIL, 2)
