"""Where the host time of engine steps goes on the GPU machine: the bench-throughput workload
with (1) CUDA's sync debug mode (every host-device synchronization inside a step is reported
with its stack), allocator counters before and after, and the per-step host phases; (2) the
same run under cProfile, printing the functions under ModelRunner.execute by cumulative time.
A diagnostic for tuning, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/profile_host.py --preset qwen2-0.5b --out DIR
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import os
import pstats
import traceback
import warnings

import torch

from pagedrt.bench.common import add_model_args, load, make_llm
from pagedrt.bench.throughput import make_workload, trace_steps


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


ALLOC_KEYS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams",
              "num_ooms")


def alloc_counters() -> dict:
    stats = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
    return {k: stats.get(k, 0) for k in ALLOC_KEYS}


OP_STEP: list = [None]  # a function giving the current step index while op timing is on
LONGEST_LINEAR: dict = {}  # step -> shape of its longest linear call


def time_ops() -> dict:
    """Wrap the model's op entry points with host timers; returns {step: {op: ms}}."""
    import collections
    import time

    import torch.nn.functional as F

    from pagedrt.models import layers
    from pagedrt.ops import attention, fused_triton

    out: dict = collections.defaultdict(lambda: collections.defaultdict(float))

    def wrap(owner, attr, label):
        fn = getattr(owner, attr)

        def timed(*a, **kw):
            if OP_STEP[0] is None:
                return fn(*a, **kw)
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                ms = 1e3 * (time.perf_counter() - t)
                step = out[OP_STEP[0]()]
                step[label] += ms
                if ms > step[label + " (longest call)"]:
                    step[label + " (longest call)"] = ms
                    if label == "linear":  # its shape: rows x in -> out
                        LONGEST_LINEAR[OP_STEP[0]()] = (
                            f"{a[0].shape[0]} x {a[0].shape[1]} -> {a[1].shape[0]}")

        setattr(owner, attr, timed)

    wrap(layers, "_linear", "linear")
    wrap(F, "embedding", "embedding")
    wrap(layers.ParallelLMHead, "forward", "lm_head")
    for name in ("rms_norm_triton", "rotary_triton", "silu_and_mul_triton"):
        wrap(fused_triton, name, name)
    for name in ("write_kv", "paged_attention_decode", "paged_attention_extend"):
        wrap(attention, name, name)
    return out


def jit_cache_sizes() -> dict:
    """Compiled variants held by each Triton kernel of pagedrt (all devices)."""
    import sys

    from triton.runtime.jit import JITFunction

    sizes = {}
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("pagedrt.ops"):
            continue
        for name, obj in vars(mod).items():
            if isinstance(obj, JITFunction):
                try:
                    sizes[name] = sum(len(c[0]) for c in obj.device_caches.values())
                except Exception:  # noqa: BLE001 - internal layout differs between versions
                    sizes[name] = -1
    return sizes


def main() -> None:
    p = argparse.ArgumentParser()
    add_model_args(p)
    p.add_argument("--workload", default="fixed", choices=["fixed", "nanovllm"])
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=12, help="steps of the trace to print")
    p.add_argument("--ops-only", action="store_true", help="only the per-op host times")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    loaded, name = load(args)
    llm = make_llm(loaded, args)
    engine = llm.llm_engine
    warm, warm_params, _ = make_workload(args, seed=3)
    llm.generate(warm, [dataclasses.replace(q, max_tokens=min(8, q.max_tokens))
                        for q in warm_params], use_tqdm=False)
    report: dict = {"preset": name,
                    "gemm_warm_up_s": getattr(engine.model_runner, "gemm_warm_up_s", None)}
    print("GEMM warm-up at start-up:", report["gemm_warm_up_s"], "s")

    # (0) host time of each op of the model per step (perf_counter around the op wrappers,
    # about 1 us each) and the Triton kernels compiled during the run
    op_ms, jit_before = time_ops(), jit_cache_sizes()
    prompts, params, _ = make_workload(args, seed=6)
    trace0, finish0 = trace_steps(engine)
    OP_STEP[0] = lambda: len(trace0)
    llm.generate(prompts, params, use_tqdm=False)
    sync()
    finish0()
    OP_STEP[0] = None
    jit_after = jit_cache_sizes()
    report["triton_compiles_during_run"] = {k: jit_after[k] - jit_before.get(k, 0)
                                           for k in jit_after if jit_after[k] != jit_before.get(k, 0)}
    report["op_host_ms_first_steps"] = {
        step: {op: round(ms, 3) for op, ms in sorted(ops.items(), key=lambda x: -x[1])[:8]}
        for step, ops in sorted(op_ms.items()) if step < args.steps}
    print("triton compiles during the timed run:", report["triton_compiles_during_run"])
    for step, ops in report["op_host_ms_first_steps"].items():
        row = trace0[step]
        print(f"step {step}: wall {1e3 * row[0]:.1f} ms, device {row[3] and round(row[3], 1)}, "
              f"forward {row[4].get('forward')}; longest linear {LONGEST_LINEAR.get(step)}; "
              f"ops {ops}")

    if args.ops_only:
        with open(os.path.join(args.out, f"profile_host_{name}.json"), "w") as f:
            json.dump(report, f, indent=1)
        return

    # (1) sync debug mode + allocator counters + per-step host phases
    prompts, params, _ = make_workload(args, seed=0)
    syncs: list = []
    trace, finish = trace_steps(engine)  # during step k, len(trace) == k
    before = alloc_counters()
    sync()
    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message).lower():
            stack = [ln.strip() for ln in traceback.format_stack()[-9:-1]]
            syncs.append({"step": len(trace), "message": str(message)[:200], "stack": stack})

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            llm.generate(prompts, params, use_tqdm=False)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    sync()
    finish()
    report["alloc_counters_during_run"] = {k: v - before[k] for k, v in alloc_counters().items()}
    report["num_sync_warnings"] = len(syncs)
    report["sync_warnings_first"] = syncs[:10]
    report["trace_first_steps"] = trace[: args.steps]
    print(json.dumps({k: v for k, v in report.items() if k != "trace_first_steps"}, indent=1))
    for row in trace[: args.steps]:
        device_ms = row[3] and round(row[3], 1)
        print(f"{1e3 * row[0]:7.1f} ms  reqs {row[1]:4d}  tokens {row[2]:6d}  "
              f"device {device_ms}  host {row[4]}")

    # (2) torch.profiler (CPU ops with Python stacks) over the same workload on other token
    # ids; the steps are labelled, and the long CPU ops of the slowest steps after the first
    # are listed with their stacks
    from torch.profiler import ProfilerActivity, profile, record_function

    prompts, params, _ = make_workload(args, seed=4)
    inner = engine.step
    count = [0]

    def labelled():
        with record_function(f"engine_step_{count[0]}"):
            count[0] += 1
            return inner()

    engine.step = labelled
    sync()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        llm.generate(prompts, params, use_tqdm=False)
        sync()
    del engine.step
    events = prof.events()
    steps = sorted((e for e in events if e.name.startswith("engine_step_")),
                   key=lambda e: e.time_range.elapsed_us(), reverse=True)
    slow = []
    for st in [e for e in steps if e.name != "engine_step_0"][:3]:
        lo, hi = st.time_range.start, st.time_range.end
        inside = [e for e in events if lo <= e.time_range.start and e.time_range.end <= hi
                  and e is not st and e.time_range.elapsed_us() > 2000
                  and not any(x in e.name for x in ("module.py(", "_contextlib", "nn.Module"))]
        inside.sort(key=lambda e: e.time_range.elapsed_us(), reverse=True)
        slow.append({"step": st.name, "ms": st.time_range.elapsed_us() / 1e3, "long_ops": [
            {"name": e.name, "ms": e.time_range.elapsed_us() / 1e3,
             "stack": [f for f in e.stack if "pagedrt" in f][:6]} for e in inside[:25]]})
    report["slowest_steps_profiled"] = slow
    print(json.dumps(slow, indent=1)[:6000])

    # (3) cProfile of the same workload on other token ids
    prompts, params, _ = make_workload(args, seed=5)
    prof = cProfile.Profile()
    sync()
    prof.enable()
    llm.generate(prompts, params, use_tqdm=False)
    sync()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
    text = buf.getvalue()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
    text += buf.getvalue()
    with open(os.path.join(args.out, f"profile_host_{name}.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"profile_host_{name}.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
