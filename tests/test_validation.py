"""Request checks against the engine's limits (pagedrt/engine/validation.py) and the
max_model_len bound at construction: each error names the value and a fix that can be taken."""

import types

import pytest

from pagedrt.distributed.executor import resolve_max_model_len
from pagedrt.engine.validation import EngineLimits, validate_prompt
from pagedrt.sampling_params import SamplingParams


def limits(max_model_len: int, max_position_embeddings: int | None) -> EngineLimits:
    return EngineLimits(vocab_size=100, max_model_len=max_model_len, num_blocks=1000,
                        block_size=16, max_num_seqs=8,
                        max_position_embeddings=max_position_embeddings)


def test_a_long_prompt_names_how_far_max_model_len_can_rise():
    with pytest.raises(ValueError, match=r"more than max_model_len=64; shorten it or raise "
                       r"max_model_len \(`--max-model-len` on the command line, up to the "
                       r"model's max_position_embeddings=256\)"):
        validate_prompt([1] * 65, SamplingParams(max_tokens=1), limits(64, 256))


def test_a_long_prompt_at_the_models_own_limit_says_only_shorten_it():
    with pytest.raises(ValueError, match=r"more than max_model_len=256; shorten it \("
                       r"max_model_len is already the model's max_position_embeddings=256\)$"):
        validate_prompt([1] * 257, SamplingParams(max_tokens=1), limits(256, 256))


def test_a_long_prompt_without_a_known_bound_still_says_raise_it():
    with pytest.raises(ValueError, match=r"shorten it or raise max_model_len "
                       r"\(`--max-model-len` on the command line\)$"):
        validate_prompt([1] * 65, SamplingParams(max_tokens=1), limits(64, None))


def test_a_prompt_that_fits_passes():
    validate_prompt([1] * 63, SamplingParams(max_tokens=1), limits(64, 256))


def test_max_model_len_past_the_model_names_the_bound_and_the_flag():
    config = types.SimpleNamespace(max_model_len=99999)
    model = types.SimpleNamespace(max_position_embeddings=8192)
    with pytest.raises(ValueError, match=r"max_model_len=99999 exceeds the model's "
                       r"max_position_embeddings=8192; pass at most that \(`--max-model-len`"):
        resolve_max_model_len(config, model)
    assert resolve_max_model_len(types.SimpleNamespace(max_model_len=None), model) == 8192
