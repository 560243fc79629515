"""`pagedrt bench throughput`: offline throughput, with HF transformers in the same run.

Workloads (random token ids, ignore_eos, so every request generates exactly its output length):
  fixed     --num-requests N of --input-len in / --output-len out tokens
  nanovllm  nano-vllm's bench.py workload: 256 requests, input and output lengths uniform in
            [100, 1024], Python `random.seed(0)`, token ids in [0, 10000], temperature 0.6

Reports output tok/s, total tok/s, requests/s; a per-step trace of the timed run (wall time
between steps, requests and tokens scheduled, device time of the model from CUDA events),
summed for decode-only steps and steps with prefill; the mean step time split into schedule,
prepare, forward, sample, update (a second pass with a device sync per phase); KV usage; and the
honest roofline of `pagedrt.bench.roofline` (the least time any engine could take: work a
minimal engine must do, against the run's measured read bandwidth and matmul rate in the
model's dtype); efficiency = floor / measured time.

--compare hf runs, on the same weights in the same process: HF `generate` (static batch,
SDPA) and HF `generate_batch` (its continuous batching, attn_implementation "paged|sdpa").

  text      --num-requests N real-text prompts (pagedrt/bench/text_prompts.py, in turn: answers
            that repeat their prompt and answers that do not; needs --model with a tokenizer),
            greedy, ignore_eos, output lengths uniform in [--output-len / 2, --output-len]
            (seeded), all submitted at once

--compare-speculative runs the workload with the engine's --speculative-config and without
it, in the same process, and prints the ratio (speculation switches itself off while more than
its disable_by_batch_size sequences are unfinished, so at 256 requests it should cost nothing);
--repeats R makes R rounds of one engine each way, in ABBA order, and compares the medians
(engines made one after another in a process differ by up to ~15% on the H200).

--beam-width W instead compares beam search of width W with n = W sampling of the same prompts
and (with --compare hf) HF `generate(num_beams=W)` (pagedrt/bench/beam.py).

--repeats R times the workload R times in one engine (after the first run on other token ids
of the same lengths) and reports the median run: one run of a process varies by up to ~10%
on the H200, R runs in one process much less (benchmarks/results/RUNS.md, "Runs of 2026-12-02
(03:20-03:55 UTC)"). Each --batch-sizes row is timed the same way, after a warm-up at its own
batch size (without it, the first process on a machine timed batch 1 at 93 tok/s against ~950:
kernels compiled in the timed run).

--compare-kv-cache-dtype DTYPE runs the timed workload again on the same weights with that KV
cache dtype (e.g. `--kv-cache-dtype fp8 --compare-kv-cache-dtype auto`): output tok/s and the
KV blocks each cache fits, and their ratio. --skip-step-split and --warm-up-requests shorten a
long run (no second, synchronizing pass; a warm-up of fewer requests).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from collections.abc import Callable

import torch

from pagedrt.bench.common import (
    add_model_args,
    device_ceilings,
    format_start_up,
    free_llm,
    hf_model_like,
    int_list,
    load,
    make_llm,
    start_up_report,
    sync,
    sync_engine,
    write_results,
)
from pagedrt.bench.roofline import RooflineModel, roofline_floor
from pagedrt.engine.llm_engine import resolve_device
from pagedrt.entrypoints.arg_parser import ArgumentParser
from pagedrt.models.loader import LoadedModel
from pagedrt.sampling_params import SamplingParams

SAMPLING_SETTINGS = {
    "greedy": {"temperature": 0.0},
    "nanovllm": {"temperature": 0.6},
    "filters": {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "min_p": 0.05},
    "penalties": {"temperature": 0.8, "repetition_penalty": 1.1, "frequency_penalty": 0.2,
                  "presence_penalty": 0.1},
    "seeded": {"temperature": 0.6},  # and a seed per request
}
"""--sampling: settings that replace those of every request of the workload (the host work of
a step depends on them; benchmarks/host_step_cpu.py measures it without a GPU)."""


def make_workload(args, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams], str]:
    """The requests (with --sampling's settings, if given); `seed` != 0 gives other token ids
    of the same lengths (no cache hits; the text workload puts `seed` distinct tokens before
    each prompt instead)."""
    prompts, params, name = _make_workload(args, seed)
    settings = getattr(args, "sampling", "")
    if settings:
        params = [dataclasses.replace(p, **SAMPLING_SETTINGS[settings],
                                      seed=i if settings == "seeded" else p.seed)
                  for i, p in enumerate(params)]
        name = f"{name} {settings}"
    return prompts, params, name


def _make_workload(args, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams], str]:
    if args.workload == "text":
        return text_workload(args, seed)
    if args.workload == "nanovllm":
        random.seed(0)
        n = 256
        prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))]
                   for _ in range(n)]
        params = [SamplingParams(temperature=0.6, ignore_eos=True,
                                 max_tokens=random.randint(100, 1024)) for _ in range(n)]
        if seed:
            g = torch.Generator().manual_seed(seed)
            prompts = [torch.randint(0, 10000, (len(p),), generator=g).tolist() for p in prompts]
        return prompts, params, "nanovllm"
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 10000, (args.num_requests, args.input_len), generator=g).tolist()
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.output_len)
              for _ in prompts]
    return prompts, params, f"{args.num_requests}x{args.input_len}x{args.output_len}"


def text_workload(args, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams], str]:
    from pagedrt.bench.text_prompts import text_prompts

    tokenizer = args.tokenizer
    if tokenizer is None:
        raise ValueError("--workload text needs a model with a tokenizer (--model)")
    kinds = text_prompts()
    messages = [m for pair in zip(kinds["repeat"], kinds["novel"]) for m in pair]
    messages += kinds["novel"][len(kinds["repeat"]):]
    if getattr(tokenizer, "chat_template", None):  # (the template writes its special tokens)
        messages = [tokenizer.apply_chat_template([{"role": "user", "content": m}],
                                                  tokenize=False, add_generation_prompt=True)
                    for m in messages]
        encoded = [tokenizer.encode(m, add_special_tokens=False) for m in messages]
    else:
        encoded = [tokenizer.encode(m) for m in messages]
    rng = random.Random(seed)
    prompts, params = [], []
    for i in range(args.num_requests):
        prefix = [rng.randrange(100, 1000) for _ in range(seed and 8)]
        prompts.append(prefix + encoded[i % len(encoded)])
        params.append(SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=rng.randint(
            max(args.output_len // 2, 1), args.output_len)))
    return prompts, params, f"text{args.num_requests}x{args.output_len}"


def roofline(mc, prompts, params, ceilings: dict, dtype, kv_cache_dtype: str = "auto") -> dict:
    """The honest floor of these requests on model `mc` (`pagedrt.bench.roofline`, formula in
    its docstring): {"floor_s", "bound_s", "flops", "bytes", "steps", "compute_bound_steps"}.
    kv_cache_dtype "fp8": K/V read as one byte per element plus a 4-byte scale per token and
    KV head (pagedrt.ops.fp8)."""
    elem = torch.empty((), dtype=dtype).element_size()
    kv_elem = 1 + 4 / mc.head_dim if kv_cache_dtype == "fp8" else None
    return roofline_floor(RooflineModel.from_config(mc), [len(p) for p in prompts],
                          [p.max_tokens for p in params], ceilings, elem, kv_elem)


def timed_generate(llm, prompts, params) -> tuple[float, int, list]:
    """(seconds, engine steps, outputs) of one offline run."""
    engine = llm.llm_engine
    base_steps = engine.counters["num_steps"]
    sync_engine(engine)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync_engine(engine)
    return time.perf_counter() - t, engine.counters["num_steps"] - base_steps, outs


WARM_UP_RUN = 4000  # `fresh_seed`'s run number of a warm-up (timed runs: 1, 2, ...)


def fresh_seed(run: int, num_requests: int) -> int:
    """The token-id seed of a workload's warm-up (run WARM_UP_RUN) or of its timed run `run`
    after the first (1, 2, ...): one of its own for every (run, num_requests), so that no run
    of a process meets prompts an earlier run left in the prefix cache. `make_workload` draws
    the [num_requests, input_len] ids of a seed in order, so two workloads of one seed share
    their first rows: until 2026-12-05 the repeats of every --batch-sizes row took seeds 1001,
    1002 like the main workload's, so they found their prompts cached and skipped the
    prefill, and their median ran up to 1.4x the first run (benchmarks/results/RUNS.md, "Runs
    of 2026-12-05 (21:40-22:15 UTC)"). The first runs keep their seeds (0 for the workload,
    100 + num_requests for a --batch-sizes row). Below 2 ** 32: torch's CPU generator keeps
    only a seed's low 32 bits.

    Raises:
        ValueError: run outside 1..WARM_UP_RUN or num_requests outside 0..999,999.
    """
    if not (1 <= run <= WARM_UP_RUN and 0 <= num_requests < 1_000_000):
        raise ValueError(f"run={run}, num_requests={num_requests}: need 1 <= run <= "
                         f"{WARM_UP_RUN} and fewer than 1,000,000 requests")
    return 1_000_000 * run + num_requests


def repeat_seconds(llm, args, params, num_runs: int) -> list[float]:
    """Seconds of num_runs - 1 more runs of the workload `args` describes, each on fresh token
    ids of the same lengths (`fresh_seed`: no prefix-cache hit on any earlier run); with the
    first run's seconds, `--repeats` takes their median."""
    return [timed_generate(llm, make_workload(args, seed=fresh_seed(r, args.num_requests))[0],
                           params)[0]
            for r in range(1, num_runs)]


def trace_steps(engine) -> tuple[list, Callable[[], None]]:
    """Wrap engine.step to record, per call, [seconds since the previous call returned,
    requests scheduled, tokens scheduled, device ms of the model (CUDA events around
    the executor's execute, read after the run; None on CPU or with the model in worker
    processes), host ms of each phase of the call
    ({"schedule", "prepare", "forward", "sample", "update"}, from the engine's StepClock without
    synchronizing: "forward" is the time to launch the model, "update" includes waiting for
    the previous step's tokens)]. With async scheduling the last call may schedule nothing
    (0 requests): it only collects the previous step's tokens.
    Returns (the list it appends to, a function that fills in the device times and unwraps)."""
    trace: list = []
    events: list = []
    step, execute = engine.step, engine.executor.execute
    last = [time.perf_counter()]
    cuda = engine.device.type == "cuda" and engine.model_runner is not None

    def traced_execute(*a, **kw):
        if not cuda:
            return execute(*a, **kw)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = execute(*a, **kw)
        end.record()
        events.append((len(trace), start, end))
        return out

    totals = engine.clock.totals

    def traced():
        before = dict(totals)
        out = step()
        now = time.perf_counter()
        sched = engine.last_scheduler_output
        host_ms = {k: round(1e3 * (v - before.get(k, 0.0)), 3) for k, v in totals.items()}
        trace.append([now - last[0], len(sched.req_ids), sched.total_num_tokens, None,
                      host_ms])
        last[0] = now
        return out

    def finish():
        for i, start, end in events:
            trace[i][3] = start.elapsed_time(end)
        del engine.step, engine.executor.execute  # back to the class's methods

    engine.step, engine.executor.execute = traced, traced_execute
    return trace, finish


LONGEST_STEP_KEYS = ("max_step_ms", "max_step_index", "max_step_num_requests",
                     "max_step_num_tokens", "step_ms_median")


def summarize_trace(trace: list) -> dict:
    """Median and total step time (wall, and device time of the model) of decode-only steps
    and of steps with prefill tokens; the longest step of all (max_step_ms, its index in the
    trace max_step_index, and what it scheduled: a one-time stall, such as a kernel loaded on
    first use, shows there) and the median of all (step_ms_median)."""

    out = {}
    if trace:
        walls = [r[0] for r in trace]
        i = max(range(len(walls)), key=walls.__getitem__)
        out.update(max_step_ms=1e3 * walls[i], max_step_index=i,
                   max_step_num_requests=trace[i][1], max_step_num_tokens=trace[i][2],
                   step_ms_median=1e3 * statistics.median(walls))
    for kind, rows in (("decode", [r for r in trace if r[1] and r[2] == r[1]]),
                       ("prefill", [r for r in trace if r[2] > r[1]])):
        wall = [r[0] for r in rows]
        dev = [r[3] for r in rows if r[3] is not None]
        out[f"{kind}_steps"] = len(rows)
        out[f"{kind}_step_ms_median"] = 1e3 * statistics.median(wall) if wall else 0.0
        out[f"{kind}_total_s"] = sum(wall)
        out[f"{kind}_model_device_ms_median"] = statistics.median(dev) if dev else None
        out[f"{kind}_model_device_total_s"] = sum(dev) / 1e3 if dev else None
    return out


def run_pagedrt(llm, args, prompts, params, ceilings, name: str, workload: str,
                timed_runs: int = 1) -> dict:
    """The workload timed on a warmed engine, with its step trace, step split and roofline.
    timed_runs > 1 times it that many times in this engine, each run after the first on other
    token ids of the same lengths (no prefix-cache hits), and reports the median run
    (elapsed_s, output_tok_s and the rates derived from them; every run's rate in
    output_tok_s_runs); the step trace is the first run's."""
    engine = llm.llm_engine
    trace, finish_trace = trace_steps(engine)
    elapsed, num_steps, outs = timed_generate(llm, prompts, params)
    finish_trace()
    step_times = summarize_trace(trace)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    runs = [elapsed, *repeat_seconds(llm, args, params, timed_runs)]
    elapsed = statistics.median(runs)
    n_in = sum(len(p) for p in prompts)
    stats = llm.stats()
    split_ms = {}
    if not args.skip_step_split:
        # second pass on other token ids (no prefix-cache hits), synchronizing at each phase
        # boundary, for the step-time split
        other_prompts = make_workload(args, seed=1)[0]
        engine.clock.enabled = True
        engine.clock.reset()
        steps0 = engine.counters["num_steps"]
        llm.generate(other_prompts, params, use_tqdm=False)
        engine.clock.enabled = False
        steps = max(engine.counters["num_steps"] - steps0, 1)
        split_ms = {k: 1e3 * v / steps for k, v in engine.clock.totals.items()}
    if args.profile:
        profile_decode(llm, make_workload(args, seed=2)[0], args, f"{name}_{args.name}")
    floor = roofline(engine.model_config, prompts, params, ceilings, engine.dtype,
                     engine.config.kv_cache_dtype)
    return {
        "system": "pagedrt", "workload": f"{name} {workload}", "num_requests": len(prompts),
        "input_tokens": n_in, "output_tokens": n_out, "elapsed_s": elapsed,
        "output_tok_s": n_out / elapsed, "total_tok_s": (n_in + n_out) / elapsed,
        "requests_s": len(prompts) / elapsed, "num_steps": num_steps,
        "ms_per_step": 1e3 * elapsed / num_steps, "step_split_ms": split_ms,
        "output_tok_s_runs": [n_out / t for t in runs],
        "step_times": step_times, "step_trace": trace,
        "async_scheduling": engine.async_scheduling,
        "num_scheduler_steps": engine.config.num_scheduler_steps,
        "multi_step_max_num_seqs": engine.config.multi_step_max_num_seqs,
        "num_multi_step_plans": stats["num_multi_step_plans"],
        "kv_cache_dtype": stats["kv_cache_dtype"],
        "kv_cache_bytes_per_token": stats["kv_cache_bytes_per_token"],
        "kv_num_blocks": stats["num_blocks"], "kv_peak_used_blocks": stats["peak_used_blocks"],
        "peak_batch_size": stats["peak_batch_size"], "num_preemptions": stats["num_preemptions"],
        "roofline_floor_s": floor["floor_s"], "roofline_efficiency": floor["floor_s"] / elapsed,
        "roofline": floor,
        "cuda_graphs": not args.enforce_eager,
        "tensor_parallel_size": engine.executor.tp_size,
        "worker_processes": engine.model_runner is None,
    }


def profile_decode(llm, prompts, args, tag: str) -> None:
    """torch.profiler over a short run of the same batch: top kernels by device time."""
    from torch.profiler import ProfilerActivity, profile

    short = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)] * len(prompts)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        llm.generate(prompts, short, use_tqdm=False)
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40)
    import os

    with open(os.path.join(args.out, f"profile_{tag}.txt"), "w") as f:
        f.write(table)
    print(table[:6000])


def run_hf_generate(hf, prompts, params, batch_size: int, name: str, workload: str) -> dict:
    """HF static batching: batches of equal-length prompts (the fixed workload)."""
    device = hf.device
    out_len = params[0].max_tokens
    n_out = 0
    t = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        ids = torch.tensor(prompts[i:i + batch_size], device=device)
        gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len,
                          min_new_tokens=out_len, do_sample=False, pad_token_id=0)
        n_out += (gen.shape[1] - ids.shape[1]) * ids.shape[0]
    sync(device)
    elapsed = time.perf_counter() - t
    return {"system": "hf-generate", "workload": f"{name} {workload} batch{batch_size}",
            "num_requests": len(prompts), "batch_size": batch_size, "output_tokens": n_out,
            "elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
            "requests_s": len(prompts) / elapsed}


def run_hf_generate_batch(hf, prompts, params, name: str, workload: str) -> dict:
    from transformers import GenerationConfig

    out_len = max(p.max_tokens for p in params)
    gc = GenerationConfig(max_new_tokens=out_len, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    try:
        hf.set_attn_implementation("paged|sdpa")
        t = time.perf_counter()
        res = hf.generate_batch(inputs=prompts, generation_config=gc)
        sync(hf.device)
        elapsed = time.perf_counter() - t
        n_out = sum(len(r.generated_tokens) for r in res.values())
        row = {"output_tokens": n_out, "elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
               "requests_s": len(prompts) / elapsed}
    except Exception as e:  # noqa: BLE001 - a peer failing must not lose our numbers; record why
        row = {"error": f"{type(e).__name__}: {e}"[:500]}
    finally:
        try:
            hf.set_attn_implementation("sdpa")
        except Exception:  # noqa: BLE001, S110 - best-effort restore; must not mask the result
            pass
    return {"system": "hf-generate-batch", "workload": f"{name} {workload}",
            "num_requests": len(prompts), **row}


def _tokenizer(model, in_process: bool):
    """The model's tokenizer (the text workload's prompts), or None."""
    if in_process:
        return model.tokenizer
    if not isinstance(model, str):
        return None  # random weights: no tokenizer
    from pagedrt.models.loader import load_tokenizer, resolve_checkpoint

    return load_tokenizer(resolve_checkpoint(model).tokenizer_dir)


def warm_up(llm, args) -> None:
    """The same shapes and sampling settings on other token ids, 8 output tokens each
    (compiles kernels, grows the allocator's pools); the timed runs are then steady state.

    --warm-up-requests is raised, where the workload has that many, to one request past those
    whose prompts overflow a step's token budget (max_num_batched_tokens): then a prompt's
    prefill runs beside decoding rows, and the prompt that straddles the budget continues from
    the cache there. Fewer warm-up requests left those steps' kernels to compile inside the
    timed run (a batch-8 FP8 run at 8 x 4,096 read 277 against 463 tok/s with 4)."""
    warm, warm_params, _ = make_workload(args, seed=fresh_seed(WARM_UP_RUN, args.num_requests))
    n = min_warm_up_requests(args.warm_up_requests or len(warm), [len(p) for p in warm],
                             llm.llm_engine.config.max_num_batched_tokens)
    llm.generate(warm[:n], [dataclasses.replace(p, max_tokens=min(8, p.max_tokens))
                            for p in warm_params[:n]], use_tqdm=False)


def min_warm_up_requests(requested: int, prompt_lens: list[int], budget: int) -> int:
    """`requested`, raised to cover a mixed step (`warm_up`): the fewest first prompts whose
    tokens exceed `budget`, plus one, capped at len(prompt_lens); `requested` itself when all
    the prompts fit in one step."""
    total = 0
    for i, length in enumerate(prompt_lens):
        total += length
        if total > budget:
            return max(requested, min(len(prompt_lens), i + 2))
    return requested  # every prompt fits one step: no mixed step to cover


def compare_speculative(args, model, name, prompts, params, ceilings, workload) -> int:
    """The workload with speculation off and on (--speculative-config), one engine each, made
    in ABBA order (off, on, on, off, ...) for --repeats rounds, so that a drift over the run
    (clocks, or what an engine made earlier in this process leaves behind) falls on both
    sides alike. Each "on" row's throughput_vs_off compares it with the "off" row of its round;
    throughput_vs_off_median compares the medians over every round."""
    if args.speculative_config is None:
        raise ValueError("--compare-speculative needs --speculative-config JSON")
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: give at least 1")
    results = []
    sweep = args.batch_sizes
    settings = {"off": {"speculative_config": None}, "on": {}}
    for rep in range(args.repeats):
        for label in ("off", "on") if rep % 2 == 0 else ("on", "off"):
            rows = _speculation_runs(model, args, settings[label], prompts, params, ceilings,
                                     name, workload, sweep)
            for row in rows:
                row.update(speculation=label, repeat=rep)
            results += rows
    for key in {r["workload"] for r in results}:
        per = {label: [r for r in results if r["workload"] == key and r["speculation"] == label]
               for label in ("off", "on")}
        if not per["off"] or not per["on"]:
            continue
        off_median = statistics.median(r["output_tok_s"] for r in per["off"])
        on_median = statistics.median(r["output_tok_s"] for r in per["on"])
        off_by_round = {r["repeat"]: r for r in per["off"]}
        for r in per["on"]:
            r["throughput_vs_off"] = r["output_tok_s"] / off_by_round[r["repeat"]]["output_tok_s"]
            r["throughput_vs_off_median"] = on_median / off_median
    path = write_results(args.out, args.name, results, {"ceilings": ceilings})
    print(f"\n{'workload':<34} {'spec':>5} {'round':>5} {'out tok/s':>10} {'vs off':>7} "
          f"{'steps':>6} {'spec steps':>10} {'accept':>7} {'max step ms':>11} {'median':>6}")
    for r in results:
        ratio = f"{r['throughput_vs_off']:.3f}x" if "throughput_vs_off" in r else ""
        print(f"{r['workload']:<34} {r['speculation']:>5} {r['repeat']:>5} "
              f"{r['output_tok_s']:>10,.0f} {ratio:>7} {r['num_steps']:>6} "
              f"{r.get('spec_decode_num_steps', 0):>10} {_acceptance(r):>7.2f} "
              f"{r.get('max_step_ms', float('nan')):>11.2f} "
              f"{r.get('step_ms_median', float('nan')):>6.2f}")
    for key in sorted({r["workload"] for r in results if "throughput_vs_off_median" in r}):
        ratio = next(r["throughput_vs_off_median"] for r in results if r["workload"] == key
                     and "throughput_vs_off_median" in r)
        print(f"{key}: on / off, medians over {args.repeats} round(s): {ratio:.3f}x")
    print(f"results: {path}")
    return 0


def _speculation_runs(model, args, overrides, prompts, params, ceilings, name, workload,
                      sweep) -> list[dict]:
    """One engine: the timed workload, then the same workload with each of `sweep`'s request
    counts; the engine is freed before returning."""
    llm = make_llm(model, args, **overrides)
    warm_up(llm, args)
    row = run_pagedrt(llm, args, prompts, params, ceilings, name, workload)
    row.update({k: row["step_times"][k] for k in LONGEST_STEP_KEYS if k in row["step_times"]})
    row["speculative_config"] = llm.llm_engine.config.speculative_config
    row.update({k: v for k, v in llm.stats().items() if k.startswith("spec_decode")})
    rows = [row] + [_sweep_row(llm, args, b, name) for b in sweep]
    free_llm(llm)
    return rows


def _sweep_row(llm, args, num_requests: int, name: str) -> dict:
    """The workload with `num_requests` requests on `llm`, traced. (A function of its own: the
    trace's closures hold the engine, and must be gone before the engine is freed, or its KV
    cache stays on the device.)"""
    sub = argparse.Namespace(**{**vars(args), "num_requests": num_requests})
    sub_prompts, sub_params, sub_workload = make_workload(sub, seed=100 + num_requests)
    before = dict(llm.stats())
    trace, finish_trace = trace_steps(llm.llm_engine)
    elapsed, steps, outs = timed_generate(llm, sub_prompts, sub_params)
    finish_trace()
    after = llm.stats()
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    longest = summarize_trace(trace)
    return {
        "system": "pagedrt", "workload": f"{name} {sub_workload}", "num_requests": num_requests,
        "output_tokens": n_out, "elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
        "num_steps": steps, **{k: longest[k] for k in LONGEST_STEP_KEYS if k in longest},
        **{k: after[k] - before[k] for k in after if k.startswith("spec_decode_num")}}


def _acceptance(row: dict) -> float:
    drafted = row.get("spec_decode_num_draft_tokens", 0)
    return row.get("spec_decode_num_accepted_tokens", 0) / drafted if drafted else 0.0


def _main_beam(llm, loaded, args, prompts, name: str, workload: str) -> int:
    from pagedrt.bench import beam

    results = beam.run(llm, loaded, args, prompts, name, workload)
    free_llm(llm)
    if args.compare == "hf":
        results.append(beam.run_hf_beam(loaded, prompts, args, f"{name} {workload}"))
    path = write_results(args.out, args.name, results, {"beam_width": args.beam_width})
    print(f"results: {path}")
    print("\n".join(beam.summary(results, args.beam_width)))
    return 0


def _start_line(name: str, workload: str, prompts: list[list[int]],
                params: list[SamplingParams], device: torch.device, args) -> str:
    """What the run is about to do, printed before the engine starts (on a CPU the default
    workload takes tens of minutes with nothing else printed until the tables)."""
    tokens = sum(len(p) for p in prompts) + sum(p.max_tokens for p in params)
    line = (f"pagedrt bench throughput: {name}, workload {workload}: {len(prompts)} requests, "
            f"{tokens:,} prompt and output tokens per run, on {device}; a warm-up run, then "
            f"{args.repeats} timed run(s)")
    if device.type == "cpu" and tokens > 20_000:
        line += (" (GPU-sized: on a CPU this takes many minutes; --num-requests 8 "
                 "--input-len 128 --output-len 32 takes about a minute)")
    return line


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="pagedrt bench throughput", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--workload", default="fixed", choices=["fixed", "nanovllm", "text"])
    p.add_argument("--sampling", default="", choices=SAMPLING_SETTINGS,
                   help="replace every request's sampling settings (default: the workload's "
                        "own): greedy; nanovllm "
                        "(temperature 0.6); filters (0.8, top_k 50, top_p 0.9, min_p 0.05); "
                        "penalties (0.8, repetition 1.1, frequency 0.2, presence 0.1); seeded "
                        "(0.6, a seed per request)")
    p.add_argument("--compare-speculative", action="store_true",
                   help="run the workload with --speculative-config and without it")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs of the workload in one engine (after the first on other "
                        "token ids of the same lengths); the median is reported. With "
                        "--compare-speculative: rounds of one engine each way, made in ABBA "
                        "order (off, on, on, off, ...); medians are compared")
    p.add_argument("--num-requests", type=int, default=256,
                   help="requests of the fixed workload (default: %(default)s, sized for a "
                        "GPU; on a CPU try 8 requests of 128/32 tokens)")
    p.add_argument("--input-len", type=int, default=512,
                   help="prompt tokens of each fixed-workload request (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=128,
                   help="tokens generated per fixed-workload request (default: %(default)s)")
    p.add_argument("--compare", default="", help="'hf' to run HF transformers peers")
    p.add_argument("--hf-batch-sizes", default="256", type=int_list,
                   help="comma list for HF generate (default: 256)")
    p.add_argument("--skip-generate-batch", action="store_true",
                   help="leave out HF generate_batch (very slow on CPU)")
    p.add_argument("--name", default="throughput", help="JSON file name under --out")
    p.add_argument("--profile", action="store_true", help="torch.profiler table of a short run")
    p.add_argument("--batch-sizes", default="", type=int_list,
                   help="also run the fixed workload with these numbers of requests (a sweep "
                        "for the throughput-vs-batch plot), e.g. 1,8,32,64,128")
    p.add_argument("--beam-width", type=int, default=0,
                   help="W > 0: beam search of width W against n = W sampling of the same "
                        "prompts (and HF generate(num_beams=W) with --compare hf); fixed "
                        "workload only")
    p.add_argument("--compare-kv-cache-dtype", default="", choices=["auto", "fp8"],
                   help="also run the timed workload with this KV cache dtype on the same "
                        "weights (e.g. auto against --kv-cache-dtype fp8)")
    p.add_argument("--skip-step-split", action="store_true",
                   help="leave out the second, synchronizing pass that splits the step time")
    p.add_argument("--warm-up-requests", type=int, default=None,
                   help="requests in the warm-up run (default: as many as the workload); "
                        "raised to one past those whose prompts overflow a step's token "
                        "budget, so that the warm-up has a prefill beside decoding rows")
    args = p.parse_args(argv)
    if args.beam_width and args.workload != "fixed":
        p.error("--beam-width runs the fixed workload only")
    if not 1 <= args.repeats < WARM_UP_RUN:
        p.error(f"--repeats {args.repeats}: give 1 to {WARM_UP_RUN - 1}")
    model, name = load(args)
    in_process = isinstance(model, LoadedModel)
    if args.compare == "hf" and not in_process:
        raise ValueError("--compare hf needs the model in this process: leave "
                         "--tensor-parallel-size at 1 and the executor backend at auto or uni")
    device = (next(model.model.parameters()).device if in_process
              else resolve_device(args.device))
    args.tokenizer = _tokenizer(model, in_process)
    if args.beam_width:
        prompts, _, workload = make_workload(args)
        return _main_beam(make_llm(model, args), model, args, prompts, name, workload)
    ceilings = device_ceilings(device, next(model.model.parameters()).dtype if in_process
                               else torch.bfloat16)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # what the ceilings used is free for the KV cache
    prompts, params, workload = make_workload(args)
    print(_start_line(name, workload, prompts, params, device, args), flush=True)
    if args.compare_speculative:
        return compare_speculative(args, model, name, prompts, params, ceilings, workload)

    def warmed_llm(**overrides):
        """(the engine, warmed up; `start_up_report` of its construction)."""
        start = time.perf_counter()
        llm = make_llm(model, args, **overrides)
        start_up = start_up_report(llm, time.perf_counter() - start)
        warm_up(llm, args)
        return llm, start_up

    llm, start_up = warmed_llm()
    results = [run_pagedrt(llm, args, prompts, params, ceilings, name, workload, args.repeats)]
    results[0]["start_up"] = start_up
    for b in args.batch_sizes:
        sub = argparse.Namespace(**{**vars(args), "num_requests": b})
        sub_prompts, sub_params, sub_workload = make_workload(sub, seed=100 + b)
        warm_up(llm, sub)  # this batch size's kernels and graphs, outside the timed runs
        elapsed, steps, outs = timed_generate(llm, sub_prompts, sub_params)
        runs = [elapsed, *repeat_seconds(llm, sub, sub_params, args.repeats)]
        elapsed = statistics.median(runs)
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        results.append({
            "system": "pagedrt", "workload": f"{name} {sub_workload}", "num_requests": b,
            "output_tokens": n_out, "elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
            "output_tok_s_runs": [n_out / t for t in runs],
            "num_steps": steps, "ms_per_step": 1e3 * elapsed / steps,
            "roofline_efficiency": roofline(
                llm.llm_engine.model_config, sub_prompts, sub_params, ceilings,
                llm.llm_engine.dtype, llm.llm_engine.config.kv_cache_dtype)["floor_s"] / elapsed,
        })
    free_llm(llm)
    if args.compare_kv_cache_dtype:
        llm, _ = warmed_llm(kv_cache_dtype=args.compare_kv_cache_dtype)
        results.append(run_pagedrt(llm, args, prompts, params, ceilings, name, workload,
                                   args.repeats))
        free_llm(llm)
    if args.compare == "hf":
        hf = hf_model_like(model, next(model.model.parameters()).dtype, device)
        if args.workload == "fixed":
            for bs in args.hf_batch_sizes:
                n = min(len(prompts), bs)  # one static batch of bs requests
                results.append(run_hf_generate(hf, prompts[:n], params[:n], bs, name, workload))
        if not args.skip_generate_batch:
            results.append(run_hf_generate_batch(hf, prompts, params, name, workload))
        del hf
    path = write_results(args.out, args.name, results, {"ceilings": ceilings})
    print(f"\n{'system':<18} {'workload':<34} {'out tok/s':>10} {'vs HF gen':>9} {'eff':>6}")
    hf_rows = [r for r in results if r["system"] == "hf-generate" and "output_tok_s" in r]
    # the strongest static-batch HF figure (its largest batch) is the yardstick
    hf_rate = max((r["output_tok_s"] for r in hf_rows), default=None)
    for r in results:
        rate = r.get("output_tok_s")
        ratio = f"{rate / hf_rate:.1f}x" if rate and hf_rate else "-"
        eff = f"{r['roofline_efficiency']:.0%}" if "roofline_efficiency" in r else ""
        shown = f"{rate:,.0f}" if rate else r.get("error", "?")[:40]
        print(f"{r['system']:<18} {r['workload']:<34} {shown:>10} {ratio:>9} {eff:>6}")
    for r in results:
        if "kv_cache_dtype" in r:
            print(f"pagedrt KV cache {r['kv_cache_dtype']}: {r['output_tok_s']:,.0f} output tok/s,"
                  f" {r['kv_num_blocks']} blocks ({r['kv_peak_used_blocks']} used at peak), "
                  f"peak batch {r['peak_batch_size']}, {r['num_preemptions']} preemptions")
    kv_rows = [r for r in results if "kv_cache_dtype" in r and r is not results[0]
               and r["workload"] == results[0]["workload"]]
    for r in kv_rows:
        print(f"  {results[0]['kv_cache_dtype']} / {r['kv_cache_dtype']}: output tok/s "
              f"{results[0]['output_tok_s'] / r['output_tok_s']:.2f}x, KV blocks "
              f"{results[0]['kv_num_blocks'] / r['kv_num_blocks']:.2f}x")
    r0 = results[0]
    split = (", ".join(f"{k} {v:.2f}" for k, v in r0["step_split_ms"].items())
             or "not measured (--skip-step-split)")
    st = r0["step_times"]
    for kind in ("decode", "prefill"):
        dev = st[f"{kind}_model_device_total_s"]
        dev = f"; model on the device {dev:.3f} s" if dev is not None else ""
        print(f"pagedrt {kind} steps: {st[f'{kind}_steps']}, median "
              f"{st[f'{kind}_step_ms_median']:.2f} ms, {st[f'{kind}_total_s']:.3f} s in all{dev}")
    steps = r0["num_scheduler_steps"]
    if steps > 1:  # (auto or asked for: which runs those figures are)
        cap = r0["multi_step_max_num_seqs"]
        print(f"pagedrt multi-step decode: up to {steps} passes a plan"
              f"{'' if cap is None else f' while at most {cap} sequences decode'}; "
              f"{r0['num_multi_step_plans']} plans of several passes (llm.stats())")
    if len(r0["output_tok_s_runs"]) > 1:
        print("pagedrt output tok/s of each run: "
              + ", ".join(f"{x:,.0f}" for x in r0["output_tok_s_runs"]) + " (median above)")
    print(format_start_up(r0["start_up"]))
    print(f"pagedrt step split (ms/step): {split}"
          f" | steps {r0['num_steps']}"
          f" | KV blocks {r0['kv_peak_used_blocks']}/{r0['kv_num_blocks']}")
    print(f"results: {path}")
    try:
        from pagedrt.bench.plots import plot_throughput

        print("plots:", ", ".join(plot_throughput(results, args.out, args.name)))
    except ImportError as e:  # matplotlib missing: the numbers are in the JSON
        print(f"no plots: {e}")
    return 0
