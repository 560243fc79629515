"""Command-line options made from `EngineConfig`'s fields: one option per field.

The field's type gives the option's type (a bool, or an Optional bool, is a --flag/--no-flag
pair; `X | None` takes X; a dict is a JSON object, as vLLM's --speculative-config), its default the option's default, its metadata the help text, the
choices and the flags (default: --field-name). A field of a type this module cannot map
(a tuple, a union of two types) raises TypeError when a parser is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing

from pagedrt.config import EngineConfig

_TYPES = typing.get_type_hints(EngineConfig)  # the annotations are strings (future import)


def _option(f: dataclasses.Field) -> tuple[tuple[str, ...], str, dict]:
    """(flags, dest, add_argument keywords) of one EngineConfig field."""
    flags = tuple(f.metadata.get("flags", ("--" + f.name.replace("_", "-"),)))
    dest = flags[0][2:].replace("-", "_")
    hint = _TYPES[f.name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        not_none = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(not_none) == 1:
            hint = not_none[0]
    kwargs: dict = {"dest": dest, "default": f.default,
                    "help": f.metadata["help"].replace("%", "%%") + " (default: %(default)s)"}
    if hint is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif hint is dict:
        kwargs["type"] = _json_object
        kwargs["metavar"] = "JSON"
    elif hint in (int, float, str):
        kwargs["type"] = hint
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
    else:
        raise TypeError(f"EngineConfig.{f.name} has type {hint!r}, which has no command-line "
                        "form; give it one in pagedrt/entrypoints/engine_args.py")
    return flags, dest, kwargs


def add_engine_config_args(p: argparse.ArgumentParser) -> None:
    """One option per EngineConfig field, defaulting to the field's default. Its dest is the
    name of its first flag (the field name but for seed: engine_seed); a caller changes a
    default with `p.set_defaults(dest=value)`."""
    group = p.add_argument_group("engine options (pagedrt.EngineConfig)")
    for f in dataclasses.fields(EngineConfig):
        flags, _, kwargs = _option(f)
        group.add_argument(*flags, **kwargs)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """EngineConfig keyword arguments from options added by `add_engine_config_args`."""
    return {f.name: getattr(args, _option(f)[1]) for f in dataclasses.fields(EngineConfig)}


def option_of_error(message: str) -> str | None:
    """The command-line option of the EngineConfig field a ValueError's message starts with
    ("num_scheduler_steps=0 must be ..." -> "--num-scheduler-steps"; seed's is --engine-seed),
    or None: the messages name the field, which a command-line user did not type."""
    for f in dataclasses.fields(EngineConfig):
        if message.startswith(f.name + "="):
            return _option(f)[0][0]
    return None


def _json_object(text: str) -> dict:
    """A JSON object from the command line (argparse reports the ValueError's message)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {text[:80]!r}")
    return value
