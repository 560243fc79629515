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

# every switch the package reads through `env_flag` (tests/test_env_flags.py checks this list
# against the source)
SWITCHES = (
    "PAGEDRT_ASYNC_SCHEDULING", "PAGEDRT_BEAM_KERNEL", "PAGEDRT_COLD_L2_TIMING",
    "PAGEDRT_EXTEND_NARROW_DECODE", "PAGEDRT_FP8_PREFILL_MMA", "PAGEDRT_FP8_V_DIM_MAJOR",
    "PAGEDRT_FUSED_OPS", "PAGEDRT_FUSED_ROPE", "PAGEDRT_FUSED_SMALL_BATCH", "PAGEDRT_GEMV",
    "PAGEDRT_MATMUL", "PAGEDRT_PDL", "PAGEDRT_SAMPLE_KERNEL", "PAGEDRT_SAMPLE_SPLIT",
    "PAGEDRT_STAGED_GRAPH_INPUTS", "PAGEDRT_TIMING_LEAD",
)
# every choice read through `env_choice`: name -> (its words, the default first)
CHOICES = {"PAGEDRT_VERIFY_ATTENTION": ("decode", "extend")}


def env_flag(name: str, default: bool | None) -> bool | None:
    """The switch `name` from the environment: True for "1", False for "0", `default` where
    unset or empty (None where the caller decides by other means, e.g. the device).

    Raises:
        ValueError: any other value.
    """
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
        env_flag(name, None)
    for name in CHOICES:
        env_choice(name)
