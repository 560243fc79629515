"""SamplingParams validation: non-finite numbers refused, messages short, the greedy floor."""

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
