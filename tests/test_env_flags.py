"""PAGEDRT_* on/off switches (pagedrt/env_flags.py): 0 and 1 read as such, unset or empty as
the default, anything else refused by name, where the engine reads them."""

import pytest

from pagedrt import env_flags
from pagedrt.env_flags import env_flag


@pytest.mark.parametrize("default", [True, False, None])
def test_zero_one_and_unset(monkeypatch, default):
    monkeypatch.setitem(env_flags.SWITCHES, "PAGEDRT_TEST_SWITCH", default)
    monkeypatch.delenv("PAGEDRT_TEST_SWITCH", raising=False)
    assert env_flag("PAGEDRT_TEST_SWITCH") is default
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", "")
    assert env_flag("PAGEDRT_TEST_SWITCH") is default
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", "1")
    assert env_flag("PAGEDRT_TEST_SWITCH") is True
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", " 0 ")
    assert env_flag("PAGEDRT_TEST_SWITCH") is False


@pytest.mark.parametrize("value", ["banana", "true", "on", "2", "-1"])
def test_other_values_are_refused_by_name(monkeypatch, value):
    monkeypatch.setitem(env_flags.SWITCHES, "PAGEDRT_TEST_SWITCH", True)
    monkeypatch.setenv("PAGEDRT_TEST_SWITCH", value)
    with pytest.raises(ValueError, match=rf"PAGEDRT_TEST_SWITCH='{value}'; set it to 0 \(off\) "
                                         r"or 1 \(on\), or unset it for the default \(1\)"):
        env_flag("PAGEDRT_TEST_SWITCH")


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


def test_the_lists_name_every_switch_and_choice_the_package_reads():
    """SWITCHES and CHOICES, what `check_environment` checks, against the calls in pagedrt/:
    a switch read but not listed would go unchecked until it is read (and then fail with a
    KeyError), one listed but not read is checked for nothing."""
    import re
    from pathlib import Path

    source = "\n".join(p.read_text() for p in
                       (Path(env_flags.__file__).parent).rglob("*.py"))
    assert set(re.findall(r'env_flag\("(PAGEDRT_\w+)"\)', source)) == set(env_flags.SWITCHES)
    assert set(re.findall(r'env_choice\("(PAGEDRT_\w+)"\)', source)) == set(env_flags.CHOICES)


def test_choices(monkeypatch):
    from pagedrt.env_flags import env_choice

    monkeypatch.delenv("PAGEDRT_VERIFY_ATTENTION", raising=False)
    assert env_choice("PAGEDRT_VERIFY_ATTENTION") == "decode"
    monkeypatch.setenv("PAGEDRT_VERIFY_ATTENTION", " extend ")
    assert env_choice("PAGEDRT_VERIFY_ATTENTION") == "extend"
    monkeypatch.setenv("PAGEDRT_VERIFY_ATTENTION", "extent")
    with pytest.raises(ValueError, match="PAGEDRT_VERIFY_ATTENTION='extent'; set it to decode "
                                         r"or extend, or unset it for the default \(decode\)"):
        env_choice("PAGEDRT_VERIFY_ATTENTION")


@pytest.mark.parametrize("name, value", [("PAGEDRT_GEMV", "true"), ("PAGEDRT_PDL", "banana"),
                                         ("PAGEDRT_VERIFY_ATTENTION", "extent")])
def test_an_engine_refuses_a_bad_value_before_it_loads_the_model(monkeypatch, tmp_path, name,
                                                                 value):
    """A second fresh user's finding: switches read when a kernel module is first imported
    (PAGEDRT_GEMV, PAGEDRT_PDL) failed only after the model had loaded, and one read only on
    CUDA (PAGEDRT_VERIFY_ATTENTION) not at all on CPU. `check_environment` runs first: the
    engine names the variable, not the missing model file."""
    from pagedrt.engine.llm_engine import LLMEngine

    monkeypatch.setenv(name, value)
    default = {"PAGEDRT_VERIFY_ATTENTION": "decode"}.get(name, "1")  # (as the calls give it)
    with pytest.raises(ValueError, match=rf"{name}='{value}'.*the default \({default}\)"):
        LLMEngine(str(tmp_path / "no-such-model.gguf"), device="cpu")
    monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="no-such-model"):  # the check passes; the model fails
        LLMEngine(str(tmp_path / "no-such-model.gguf"), device="cpu")
