"""Where a small-batch decode step's wall time goes on the device (issue 16): the kernels of
N decode steps of the Qwen2-0.5B preset (random weights, CUDA graphs, greedy) from a
torch.profiler trace, with their start and end times, summed per kernel name three ways:
its own durations (with programmatic dependent launch a kernel starts early and waits, so
these overlap), its "exposed" time (the part of each kernel's interval no earlier kernel
covers: what it adds to the timeline), and the idle gaps before it (no kernel running).
The exposed times and gaps add up to the span of the steps (the profiler slows the host, so
the gaps are larger than unprofiled). Before that, two unprofiled runs' wall time per step
and the start-up timing's fused-op choices. A one-off
diagnostic, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/decode_timeline.py [--batch 1]
        [--context 512] [--steps 32] [--out F.json] [--no-one-row-configs]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from pagedrt import LLM, SamplingParams
from pagedrt.bench.presets import get_preset, random_model


def kernel_intervals(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every device kernel and memory op, by start."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.time_range.start, e.time_range.end, e.name[:70]))
    return sorted(out)


def exposed_times(spans: list[tuple[float, float, str]], steps: int, layers: int
                  ) -> tuple[dict, float]:
    """{name: [count, own us, exposed us, gap-before us]} and the span (first start to last
    end, us). A kernel launched a multiple of `layers` times per step is split by its place
    in the layer ("name #i": the i-th launch of that name in each layer, e.g. the O, gate/up
    and down projections of one matmul kernel), since every step launches the same sequence."""
    totals: dict = {}
    for _, _, name in spans:
        totals[name] = totals.get(name, 0) + 1
    seen: dict = {}
    by_name: dict = {}
    covered = spans[0][0]  # the latest end so far
    for start, end, name in spans:
        k = seen[name] = seen.get(name, -1) + 1
        per_step = totals[name] // steps
        label = name
        if totals[name] % steps == 0 and per_step % layers == 0 and per_step > layers:
            label = f"{name[:64]} #{k % per_step % (per_step // layers)}"
        row = by_name.setdefault(label, [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += end - start
        row[3] += max(0.0, start - covered)
        row[2] += max(0.0, end - max(start, covered))
        covered = max(covered, end)
    return by_name, spans[-1][1] - spans[0][0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--out", default=None)
    p.add_argument("--no-one-row-configs", action="store_true",
                   help="time only the two fused configs tried before FUSED_ONE_ROW")
    args = p.parse_args()
    if args.no_one_row_configs:
        from pagedrt.ops import gemv_triton

        gemv_triton.FUSED_ONE_ROW = ()
    model = random_model(get_preset("qwen2-0.5b"), torch.bfloat16, torch.device("cuda"))
    llm = LLM(model, gpu_memory_utilization=0.5, max_num_seqs=max(8, args.batch),
              max_model_len=args.context + 3 * max(args.steps, 16) + 64)
    engine = llm.llm_engine

    def run(seed: int, steps: int, prof=None) -> float:
        """Prefill `args.batch` requests, take one decode step, then `steps` decode steps with
        every request still running (what `prof` sees, when given), then abort the requests;
        returns the wall ms per step of those `steps`. A large batch's prompts take several
        prefill steps, and the requests prefilled first decode during the later ones: with
        max_tokens past the window none finishes inside it, so every step in it is a decode
        step of the whole batch (until 2026-12-05 the window ran until the requests finished,
        and held the shrinking tail of batches below `args.batch`)."""
        g = torch.Generator().manual_seed(seed)
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=3 * steps + 32)
        ids = [f"r{seed}-{i}" for i in range(args.batch)]
        for rid in ids:
            engine.add_request(rid, torch.randint(0, 10000, (args.context,), generator=g).tolist(),
                               params, stream=False)
        while any(r.num_output_tokens < 1 for r in engine.requests.values()):
            engine.step()
        engine.step()
        torch.cuda.synchronize()
        if prof is not None:
            prof.start()
        t = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = 1e3 * (time.perf_counter() - t) / steps
        if prof is not None:
            prof.stop()
        running = sum(not r.is_finished for r in engine.requests.values())
        if running != args.batch:
            raise RuntimeError(f"{running} of {args.batch} requests ran to the window's end")
        for rid in ids:
            engine.abort_request(rid)
        while engine.has_unfinished_requests():
            engine.step()
        return wall

    run(1, 16)  # compiles, start-up timing, graphs
    walls = [run(seed, args.steps) for seed in (3, 4)]  # unprofiled: wall ms per decode step
    from pagedrt.ops import gemv_triton

    choices = {str(k): v for k, v in gemv_triton._FUSED_CHOICE.items()
               if k[2] == args.batch}
    print(f"wall ms per decode step (unprofiled, two runs): "
          f"{', '.join(f'{w:.3f}' for w in walls)}")
    print(f"fused choices at {args.batch} rows: {choices}")
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CUDA])
    run(2, args.steps, prof)
    steps = args.steps
    spans = kernel_intervals(prof)
    layers = get_preset("qwen2-0.5b").num_hidden_layers
    by_name, span = exposed_times(spans, steps, layers)
    rows = sorted(by_name.items(), key=lambda kv: -(kv[1][2] + kv[1][3]))
    print(f"batch {args.batch} ctx {args.context}: {steps} decode steps, span "
          f"{span / steps:.1f} us/step, {len(spans) / steps:.1f} kernels/step")
    print(f"{'kernel':70} {'n/step':>6} {'own':>8} {'exposed':>8} {'gap':>8}  (us/step)")
    for name, (n, own, exp, gap) in rows[:25]:
        print(f"{name:70} {n / steps:6.1f} {own / steps:8.1f} {exp / steps:8.1f} "
              f"{gap / steps:8.1f}")
    total_exp = sum(v[2] for v in by_name.values()) / steps
    total_gap = sum(v[3] for v in by_name.values()) / steps
    print(f"{'total':70} {'':6} {'':8} {total_exp:8.1f} {total_gap:8.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"span_us_per_step": span / steps, "steps": steps, "wall_ms": walls,
                       "fused_choices": choices,
                       "kernels": {k: v for k, v in rows}}, f, indent=1)


if __name__ == "__main__":
    main()
