"""Records the Triton kernel launches of a test run under the interpreter (TRITON_INTERPRET=1)
so that `tests/compile_launches.py` can compile each kernel for sm_90 with the GPU machines'
Triton (3.6) afterwards: the interpreter (3.9 here) runs code that 3.6's compiler rejects, and
a kernel that does not compile on the GPU is otherwise found only there
(benchmarks/results/RUNS.md, "Runs of 2026-12-04 (11:21-11:52 UTC)"). `make test` sets
PAGEDRT_RECORD_LAUNCHES to the file to write (conftest.py installs this module then).

An entry per pagedrt kernel (not the tests' own helper kernels) and distinct launch: the argument types (pointers as "*bf16" and so on,
Python ints as i32 or i64, floats as fp32), the constexpr values (and None arguments), and the
launch options (num_warps, num_stages, ...)."""

from __future__ import annotations

import inspect
import json

import torch

POINTER_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                 torch.float64: "fp64", torch.int8: "i8", torch.int16: "i16",
                 torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "i1",
                 torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl")
_launches: dict[str, dict] = {}  # one entry per distinct launch, by its JSON


def _arg_type(value) -> str:
    """Triton's type of a runtime argument, as a signature string."""
    if isinstance(value, torch.Tensor):
        return "*" + POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type recorded for a {type(value).__name__} argument")


def record(fn, args: tuple, kwargs: dict) -> None:
    """Adds the launch of the jit function `fn` (its Python function) with these arguments."""
    from triton.runtime.jit import _normalize_ty

    signature = inspect.signature(fn)
    bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items()
                                             if k in signature.parameters})
    bound.apply_defaults()
    annotations = {n: _normalize_ty(t) for n, t in inspect.get_annotations(fn).items()}
    types, constexprs = {}, {}
    for name, value in bound.arguments.items():
        if annotations.get(name) == "constexpr" or value is None:
            constexprs[name] = value
        else:
            types[name] = _arg_type(value)
    entry = {"module": fn.__module__, "name": fn.__name__, "types": types,
             "constexprs": constexprs,
             "options": {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs}}
    _launches.setdefault(json.dumps(entry, sort_keys=True, default=repr), entry)


def install() -> None:
    """Wraps the interpreter's launch so that every launch is recorded, then run."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        try:
            if self.fn.__module__.startswith("pagedrt."):  # not the tests' own helper kernels
                record(self.fn, args, kwargs)
        except Exception as error:  # noqa: BLE001 - never fail the test; compile_launches reports it
            entry = {"module": self.fn.__module__, "name": self.fn.__name__,
                     "unrecorded": repr(error)}
            _launches.setdefault(json.dumps(entry), entry)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording_run


def dump(path: str) -> None:
    """Writes the recorded launches to `path` as a JSON list."""
    with open(path, "w") as f:
        json.dump(list(_launches.values()), f, default=repr)
