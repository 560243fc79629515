"""Where a step's time goes on the GPU: device time of a prefill forward and of a decode
CUDA-graph replay, next to the host time of a whole engine step, plus torch.profiler kernel
tables of both, and a cProfile of decode steps. A diagnostic for tuning, not a benchmark of
record.

    PYTHONPATH=$PWD python3 benchmarks/profile_step.py --preset qwen2-0.5b --out DIR
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch

from pagedrt.bench.common import add_model_args, load, make_llm
from pagedrt.sampling_params import SamplingParams


def cuda_ms(fn, iters: int = 20) -> float:
    """Median device time of fn() in ms (CUDA events around each call)."""
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernel_table(fn, path: str, rows: int = 30) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows)
    with open(path, "w") as f:
        f.write(table)
    return table


def main() -> None:
    p = argparse.ArgumentParser()
    add_model_args(p)
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    loaded, name = load(args)
    llm = make_llm(loaded, args)
    engine = llm.llm_engine
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 10000, (args.num_seqs, args.input_len), generator=g).tolist()
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=64)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up (compile, autotune)
    res: dict = {"preset": name, "num_seqs": args.num_seqs, "input_len": args.input_len}

    # prefill forward of max_num_batched_tokens tokens (eager, as the engine runs it)
    prompts2 = torch.randint(0, 10000, (args.num_seqs, args.input_len), generator=g).tolist()
    for i, pr in enumerate(prompts2):
        engine.add_request(f"p{i}", pr, params, stream=False)
    sched = engine.scheduler.schedule()
    runner = engine.model_runner
    inputs = runner.prepare(sched, runner.batch.apply(sched))
    res["prefill_tokens"] = sched.total_num_tokens

    def prefill():
        with torch.inference_mode():
            h = engine.model(inputs.input_ids, inputs.positions, engine.kv_cache.layers,
                             inputs.meta)
            engine.model.compute_logits(
                h if inputs.logits_indices is None else h[inputs.logits_indices])

    res["prefill_forward_ms"] = cuda_ms(prefill, 5)
    print(kernel_table(prefill, os.path.join(args.out, "profile_prefill.txt"))[:5000])
    for i in range(len(prompts2)):
        engine.abort_request(f"p{i}")

    # decode: bring num_seqs requests into decode, then time steps and graph replays
    for i, pr in enumerate(prompts2):
        engine.add_request(f"d{i}", pr, SamplingParams(temperature=0.0, ignore_eos=True,
                                                        max_tokens=400), stream=False)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(8):
        engine.step()
    torch.cuda.synchronize()
    host = []
    for _ in range(30):
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        host.append(1e3 * (time.perf_counter() - t))
    res["decode_step_wall_ms"] = statistics.median(host)
    gr = runner.graph_runner
    bs = next(s for s in gr.batch_sizes if s >= args.num_seqs)
    res["decode_graph_replay_ms"] = cuda_ms(lambda: gr.graphs[1, bs].replay(), 30)
    print(kernel_table(lambda: gr.graphs[1, bs].replay(),
                       os.path.join(args.out, "profile_decode_graph.txt"))[:5000])
    # host phases without sync (the clock syncs; here we time pure host work on a synced GPU)
    clock = engine.clock
    clock.enabled = True
    clock.reset()
    for _ in range(20):
        engine.step()
    clock.enabled = False
    res["decode_split_ms"] = {k: 1e3 * v / 20 for k, v in clock.totals.items()}
    # cProfile of 30 decode steps (no sync between them): the host's functions by own time
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(30):
        engine.step()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
    with open(os.path.join(args.out, "profile_decode_host.txt"), "w") as f:
        f.write(buf.getvalue())
    print(buf.getvalue())
    for i in range(len(prompts2)):
        engine.abort_request(f"d{i}")
    print(json.dumps(res, indent=1))
    with open(os.path.join(args.out, f"profile_step_{name}.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
