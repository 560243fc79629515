"""SamplingParams and EngineConfig validation: non-finite numbers and wrong types refused with
ValueErrors naming the value, messages short, the greedy floor."""

from __future__ import annotations

import math

import pytest

from pagedrt.sampling_params import MIN_SAMPLING_TEMPERATURE, SamplingParams

_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")


@pytest.mark.parametrize("name", _FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
def test_non_finite_numbers_are_refused_naming_the_field(name, value):
    with pytest.raises(ValueError, match=rf"^{name}=.* must be a finite number") as e:
        SamplingParams(**{name: value})
    assert len(str(e.value)) < 150  # 10**400 is not echoed digit by digit


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"seed": 10**500}, r"^seed=<an int of about 500 digits> must be in"),
    ({"stop": ["x"] * 10_000 + [""]}, r"^stop=.{1,70} must be a list"),
    ({"top_k": -(10**500)}, r"^top_k=<an int of about 500 digits> must be -1"),
])
def test_huge_values_are_not_echoed_whole(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_temperatures_below_the_floor_are_greedy():
    assert MIN_SAMPLING_TEMPERATURE == 1e-5
    for t in (0.0, 1e-40, 5e-324, 9.9e-6):
        assert SamplingParams(temperature=t).greedy, t
    for t in (1e-5, 0.5, 1e6):
        assert not SamplingParams(temperature=t).greedy, t


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"stop": 5}, r"^stop=5 must be a string or a list of non-empty strings"),
    # the value as given (it read "stop=[''] must be a list of non-empty strings")
    ({"stop": ""}, (r"^stop='' must be a non-empty string \(or a list of non-empty strings; "
                   r"None or \[\] for no stop strings\)$")),
    ({"stop": ["a", "", "b"]}, (r"^stop=\['a', '', 'b'\] must be a list of non-empty strings: "
                               r"stop\[1\] is ''$")),
    ({"stop": {"a": 1}}, r"^stop=\{'a': 1\} must be a string or a list"),
    ({"stop_token_ids": 5}, r"^stop_token_ids=5 must be a list of non-negative ints"),
    ({"stop_token_ids": "5"}, r"^stop_token_ids='5' must be a list of non-negative ints"),
    ({"ignore_eos": "yes"}, r"^ignore_eos='yes' must be True or False"),
    ({"skip_special_tokens": 1}, r"^skip_special_tokens=1 must be True or False"),
    ({"include_stop_str_in_output": None}, r"^include_stop_str_in_output=None must be True"),
])
def test_wrong_types_are_a_value_error_naming_the_value(kwargs, match):
    """Found by a fresh-user trial: stop=5 raised TypeError ("'int' object is not iterable")
    and ignore_eos="yes" was taken silently."""
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_stop_lists_in_any_iterable():
    params = SamplingParams(stop=("a", "b"), stop_token_ids=(3, 4))
    assert params.stop == ["a", "b"] and params.stop_token_ids == [3, 4]
    assert SamplingParams(stop="x").stop == ["x"] and SamplingParams(stop=None).stop == []


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"block_size": "16"}, r"^block_size='16' must be an int"),
    ({"num_kv_blocks": "5"}, r"^num_kv_blocks='5' must be an int"),
    ({"max_model_len": 2.5}, r"^max_model_len=2.5 must be an int"),
    ({"max_num_seqs": True}, r"^max_num_seqs=True must be an int"),
    ({"gpu_memory_utilization": "0.5"}, r"^gpu_memory_utilization='0.5' must be a number"),
    ({"block_size": 12}, r"^block_size=12 is not supported; use 8, 16 or 32"),
])
def test_engine_config_wrong_types_name_the_value(kwargs, match):
    """EngineConfig (what LLM(...) builds): a string where an int belongs is a ValueError
    that shows it quoted (block_size="16" read "block_size=16 is not supported")."""
    from pagedrt.config import EngineConfig

    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_engine_config_takes_numpy_ints():
    import numpy as np

    from pagedrt.config import EngineConfig

    assert EngineConfig(num_kv_blocks=np.int64(5)).num_kv_blocks == 5


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "3", 2**63])
def test_bad_truncate_prompt_tokens_is_a_value_error_naming_the_field(value):
    with pytest.raises(ValueError, match=r"^truncate_prompt_tokens=.* must be None .*-1"):
        SamplingParams(truncate_prompt_tokens=value)


def test_truncate_prompt_keeps_the_last_tokens():
    from pagedrt.engine.validation import EngineLimits, truncate_prompt

    limits = EngineLimits(vocab_size=100, max_model_len=10, num_blocks=4, block_size=4,
                          max_num_seqs=4)  # the KV cache holds 16 tokens, more than 10
    ids = list(range(20))
    for k in (None, -1, 1, 3, 20, 25):
        SamplingParams(truncate_prompt_tokens=k)  # (all accepted)
    assert truncate_prompt(ids, None, 4, limits) is ids
    assert truncate_prompt(ids, 3, 4, limits) == [17, 18, 19]
    assert truncate_prompt(ids, 1, None, limits) == [19]
    short = ids[:8]
    assert truncate_prompt(short, 10, 4, limits) is short  # k >= the prompt: unchanged
    assert truncate_prompt(ids, 10, 4, limits) == ids[-10:]  # k = max_model_len
    for k in (11, 20, 25):  # above max_model_len: refused, as vLLM refuses it
        with pytest.raises(ValueError, match=f"^truncate_prompt_tokens={k} is more than "
                                             "max_model_len=10: give at most 10, or -1"):
            truncate_prompt(ids, k, 4, limits)
    assert truncate_prompt(ids, -1, 4, limits) == ids[-6:]  # max_model_len - max_tokens
    assert truncate_prompt(ids, -1, None, limits) == ids[-9:]  # room for one token
    assert truncate_prompt(ids, -1, 50, limits) == ids[-1:]  # at least one token
    small = limits._replace(num_blocks=2)  # the cache holds 8 tokens
    assert truncate_prompt(ids, -1, 4, small) == ids[-4:]
