"""On/off switches and choices read from PAGEDRT_* environment variables (README,
"Environment variables").

Every switch takes 0 (off) or 1 (on), a choice one of its words; unset or empty keeps the
default. Any other value is a ValueError naming the variable, the value and the values it
takes, so that a typo such as `PAGEDRT_SAMPLE_KERNEL=ture` is not silently read as the
default. Some are read only on CUDA or when a kernel module is first imported, so
`check_environment` checks them all when an engine starts, before the model loads.
"""

from __future__ import annotations

import os

# every switch the package reads through `env_flag`, and its default (None: the engine
# chooses, e.g. by the device); tests/test_env_flags.py checks the names against the calls
SWITCHES = {
    "PAGEDRT_ASYNC_SCHEDULING": None, "PAGEDRT_BEAM_KERNEL": True,
    "PAGEDRT_COLD_L2_TIMING": True, "PAGEDRT_EXTEND_NARROW_DECODE": True,
    "PAGEDRT_FP8_PREFILL_MMA": False, "PAGEDRT_FP8_V_DIM_MAJOR": None,
    "PAGEDRT_FUSED_OPS": True, "PAGEDRT_FUSED_ROPE": True, "PAGEDRT_FUSED_SMALL_BATCH": True,
    "PAGEDRT_GEMV": True, "PAGEDRT_GEMV_ROW": False, "PAGEDRT_MATMUL": True, "PAGEDRT_PDL": True,
    "PAGEDRT_SAMPLE_KERNEL": None, "PAGEDRT_SAMPLE_SPLIT": True,
    "PAGEDRT_STAGED_GRAPH_INPUTS": True, "PAGEDRT_TIMING_LEAD": False,
}
# every choice read through `env_choice`: name -> (its words, the default first)
CHOICES = {"PAGEDRT_VERIFY_ATTENTION": ("decode", "extend")}


def env_flag(name: str) -> bool | None:
    """The switch `name` (a key of SWITCHES) from the environment: True for "1", False for
    "0", its default in SWITCHES where unset or empty (None: the caller decides by other
    means, e.g. the device).

    Raises:
        ValueError: any other value.
    """
    default = SWITCHES[name]
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    if value in ("0", "1"):
        return value == "1"
    shown = {True: "1", False: "0", None: "chosen by the engine"}[default]
    raise ValueError(f"{name}={os.environ[name]!r}; set it to 0 (off) or 1 (on), or unset it "
                     f"for the default ({shown})")


def env_choice(name: str) -> str:
    """The choice `name` (a key of CHOICES) from the environment: one of its words, the first
    where unset or empty.

    Raises:
        ValueError: any other value.
    """
    words = CHOICES[name]
    value = os.environ.get(name, "").strip()
    if value == "":
        return words[0]
    if value in words:
        return value
    raise ValueError(f"{name}={os.environ[name]!r}; set it to {' or '.join(words)}, or unset "
                     f"it for the default ({words[0]})")


def check_environment() -> None:
    """Check every switch (SWITCHES) and choice (CHOICES) set in the environment; called by
    `LLMEngine` before it loads the model, so that a bad value is refused at once on every
    device, not when (or whether) the code that reads it runs.

    Raises:
        ValueError: the first bad value, named as `env_flag` and `env_choice` name it.
    """
    for name in SWITCHES:
        env_flag(name)
    for name in CHOICES:
        env_choice(name)
