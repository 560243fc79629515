"""PAGEDRT_* on/off switches (pagedrt/env_flags.py): 0 and 1 read as such, unset or empty as
the default, anything else refused by name, where the engine reads them."""

import pytest

from pagedrt.env_flags import env_flag


@pytest.mark.parametrize("default", [True, False, None])
def test_zero_one_and_unset(monkeypatch, default):
    monkeypatch.delenv("PAGEDRT_TEST_SWITCH", raising=False)
    assert env_flag("PAGEDRT_TEST_SWITCH", default) is default
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", "")
    assert env_flag("PAGEDRT_TEST_SWITCH", default) is default
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", "1")
    assert env_flag("PAGEDRT_TEST_SWITCH", default) is True
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", " 0 ")
    assert env_flag("PAGEDRT_TEST_SWITCH", default) is False


@pytest.mark.parametrize("value", ["banana", "true", "on", "2", "-1"])
def test_other_values_are_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", value)
    with pytest.raises(ValueError, match=rf"PAGEDRT_TEST_SWITCH='{value}'; set it to 0 \(off\) "
                                         r"or 1 \(on\), or unset it for the default \(1\)"):
        env_flag("PAGEDRT_TEST_SWITCH", True)


def test_the_sampler_refuses_a_bad_switch(monkeypatch):
    """A fresh user's finding: PAGEDRT_SAMPLE_KERNEL=banana ran with the default."""
    from pagedrt.engine.sampler import Sampler

    monkeypatch.setenv("PAGEDRT_SAMPLE_KERNEL", "banana")
    with pytest.raises(ValueError, match="PAGEDRT_SAMPLE_KERNEL='banana'.*chosen by the engine"):
        Sampler()
    monkeypatch.setenv("PAGEDRT_SAMPLE_KERNEL", "0")
    monkeypatch.setenv("PAGEDRT_SAMPLE_SPLIT", "yes")
    with pytest.raises(ValueError, match="PAGEDRT_SAMPLE_SPLIT='yes'"):
        Sampler()
    monkeypatch.setenv("PAGEDRT_SAMPLE_SPLIT", "0")
    sampler = Sampler()
    assert sampler.kernel is False and sampler.split is False
