"""On/off switches read from PAGEDRT_* environment variables (README, "Environment variables").

Every switch takes 0 (off) or 1 (on); unset or empty keeps its default. Any other value is a
ValueError naming the variable, the value and the values it takes, so that a typo such as
`PAGEDRT_SAMPLE_KERNEL=ture` is not silently read as the default.
"""

from __future__ import annotations

import os


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
