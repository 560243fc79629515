"""`pagedrt bench latency`: batch-1 decode latency (ms per output token) at given contexts,
with and without CUDA graphs, and HF transformers `generate` on the same weights (--compare hf).

ms/token = time of the decode steps after the first token / their number: the prefill of the
context is excluded, so the figure is the per-token cost a streaming user sees.

--prompts text: real prompts instead (pagedrt/bench/text_prompts.py; needs a model with a
tokenizer, --model): answers that repeat their prompt (typo correction of a paragraph, a
docstring for a function) and answers that do not, one request at a time, greedy, up to
--num-tokens tokens (EOS ends them). With --compare-speculative each prompt runs with the
engine's --speculative-config and without it, in the same process, and the table gives
decode tokens/s of both, their ratio, the acceptance rate and the mean accepted length.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pagedrt.bench.common import (
    add_model_args,
    free_llm,
    hf_model_like,
    load,
    make_llm,
    sync,
    sync_engine,
    write_results,
)
from pagedrt.config import AUTO_SCHEDULER_STEPS
from pagedrt.engine.llm_engine import resolve_device
from pagedrt.entrypoints.arg_parser import ArgumentParser
from pagedrt.models.loader import LoadedModel
from pagedrt.sampling_params import SamplingParams


def decode_ms_per_token(llm, prompt: list[int], num_tokens: int) -> float:
    """Wall ms per decode token of one greedy request of `prompt` that generates
    `num_tokens` + 1 tokens: the time from the first token on the device (the prefill's)
    to the last one on the host, over the `num_tokens` decoded in it. Divided by tokens, not
    by `engine.step()` calls: with async scheduling the last call only reads the last token
    (num_tokens + 1 calls; until 2026-12-07 the figure was divided by those, 1/(num_tokens +
    1) low), and a multi-step decode computes several tokens in one call."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=num_tokens + 1)
    req = engine.add_request("latency", prompt, params, stream=False)
    engine.step()  # prefill + first token
    sync_engine(engine)
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    sync_engine(engine)
    elapsed = time.perf_counter() - t
    return 1e3 * elapsed / (len(req.output_token_ids) - 1)


def hf_ms_per_token(hf, prompt: list[int], num_tokens: int) -> float:
    ids = torch.tensor([prompt], device=hf.device)

    def timed(n: int) -> float:
        sync(hf.device)
        t = time.perf_counter()
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                    do_sample=False, pad_token_id=0)
        sync(hf.device)
        return time.perf_counter() - t

    timed(2)
    return 1e3 * (timed(num_tokens + 1) - timed(1)) / num_tokens


def spec_counters(engine) -> dict:
    sch = engine.scheduler
    return {"drafts": sch.num_spec_drafts, "draft_tokens": sch.num_spec_draft_tokens,
            "accepted": sch.num_spec_accepted_tokens, "steps": sch.num_spec_steps,
            "early_reads": sch.num_spec_early_reads, "pauses": sch.acceptance.num_pauses}


def time_one_request(llm, prompt: list[int], max_tokens: int) -> dict:
    """One greedy request alone: decode tokens/s after the first token (and end to end),
    the longest `engine.step()` call after the first (max_step_ms: a one-time stall shows
    there), the median wall ms of the steps that verified drafts and of the others (a step
    that verified drafts is read back within its `step()` call), its tokens, and the
    speculative counters it moved."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    before = spec_counters(engine) if engine.scheduler.proposer is not None else None
    sync(engine.device)
    t0 = time.perf_counter()
    req = engine.add_request("text", prompt, params, stream=False)
    engine.step()  # the prefill and the first token
    sync(engine.device)
    t1 = time.perf_counter()
    durations = {True: [], False: []}  # wall s of each step, by whether it verified drafts
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        durations[bool(engine.last_scheduler_output.draft_token_ids)].append(
            time.perf_counter() - start)
    sync(engine.device)
    t2 = time.perf_counter()
    n = len(req.output_token_ids)
    every = durations[True] + durations[False]
    steps, longest = len(every), max(every, default=0.0)
    row = {"output_tokens": n, "steps_after_first": steps, "max_step_ms": 1e3 * longest,
           "spec_step_ms_median": 1e3 * statistics.median(durations[True])
           if durations[True] else None,
           "plain_step_ms_median": 1e3 * statistics.median(durations[False])
           if durations[False] else None,
           "e2e_s": t2 - t0,
           "decode_tok_s": (n - 1) / (t2 - t1) if n > 1 else 0.0,
           "e2e_tok_s": n / (t2 - t0), "token_ids": list(req.output_token_ids)}
    if before is not None:
        after = spec_counters(engine)
        moved = {k: after[k] - before[k] for k in after}
        row.update({f"spec_{k}": v for k, v in moved.items()})
        row["acceptance_rate"] = (moved["accepted"] / moved["draft_tokens"]
                                  if moved["draft_tokens"] else 0.0)
        row["mean_accepted_length"] = (1 + moved["accepted"] / moved["drafts"]
                                       if moved["drafts"] else 0.0)
    return row


def run_text(args, loaded, name: str) -> tuple[list[dict], list[str]]:
    """--prompts text: each prompt alone, `--repeats` times (the median run is kept), with
    speculation off and on (--compare-speculative) or as configured."""
    from pagedrt.bench.text_prompts import as_prompts, text_prompts

    configs = [("as configured", {})]
    if args.compare_speculative:
        if args.speculative_config is None:
            raise ValueError("--compare-speculative needs --speculative-config JSON")
        configs = [("off", {"speculative_config": None}), ("on", {})]
    results = []
    for label, overrides in configs:
        llm = make_llm(loaded, args, **overrides)
        kinds = text_prompts()
        warm = as_prompts(llm, kinds["novel"][:1])[0]
        time_one_request(llm, warm, 16)  # warm-up: kernels, allocator
        for kind, messages in kinds.items():
            for i, prompt in enumerate(as_prompts(llm, messages)):
                runs = [time_one_request(llm, prompt, args.num_tokens)
                        for _ in range(args.repeats)]
                best = sorted(runs, key=lambda r: r["decode_tok_s"])[len(runs) // 2]
                results.append({
                    "system": "pagedrt", "workload": f"{name} text {kind}{i}",
                    "kind": kind, "prompt": i, "speculation": label,
                    "speculative_config": llm.llm_engine.config.speculative_config,
                    "prompt_tokens": len(prompt), **best,
                    "decode_tok_s_runs": [r["decode_tok_s"] for r in runs],
                })
        free_llm(llm)
    lines = [(f"{'workload':<30} {'spec':>6} {'tokens':>6} {'tok/s':>8} {'vs off':>7} "
              f"{'accept':>7} {'mean len':>8}")]
    off = {r["workload"]: r for r in results if r["speculation"] == "off"}
    ratios: dict[str, list[float]] = {}
    for r in results:
        base = off.get(r["workload"])
        ratio = r["decode_tok_s"] / base["decode_tok_s"] if base and r is not base else None
        if ratio is not None:
            r["speedup_vs_off"] = ratio
            ratios.setdefault(r["kind"], []).append(ratio)
            r["same_tokens_as_off"] = r["token_ids"] == base["token_ids"]
        lines.append(
            f"{r['workload']:<30} {r['speculation']:>6} {r['output_tokens']:>6} "
            f"{r['decode_tok_s']:>8.1f} {'' if ratio is None else f'{ratio:.2f}x':>7} "
            f"{r.get('acceptance_rate', float('nan')):>7.2f} "
            f"{r.get('mean_accepted_length', float('nan')):>8.2f}")
    for kind, values in ratios.items():
        lines.append(f"{kind}: speedup with speculation, geometric mean "
                     f"{statistics.geometric_mean(values):.2f}x (min {min(values):.2f}x)")
    return results, lines


def _start_line(name: str, contexts: list[int], args, device: torch.device) -> str:
    """What the run is about to do, printed before the engine starts; on a CPU, where the
    default contexts take minutes with nothing printed, a CPU-sized command too."""
    line = (f"pagedrt bench latency: {name}, batch 1 at contexts "
            f"{', '.join(map(str, contexts))}: {args.num_tokens} decode tokens timed, "
            f"{args.repeats} run(s) each, on {device}")
    steps = getattr(args, "num_scheduler_steps", 1)
    if steps is None and device.type == "cuda":  # (auto is one pass on a CPU: nothing to say)
        line += (f", multi-step decode auto (up to {AUTO_SCHEDULER_STEPS} decode passes a step "
                 "with CUDA graphs; --num-scheduler-steps 1 for one)")
    elif steps is not None and steps > 1:
        line += f", up to {steps} decode passes a step (multi-step decode)"
    if device.type == "cpu" and max(contexts) * args.repeats > 1024:
        line += (" (GPU-sized: on a CPU this takes minutes; --contexts 128,512 --num-tokens 16 "
                 "--repeats 1 takes about 20 s)")
    return line


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="pagedrt bench latency", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--contexts", default="512,4096",
                   help="--prompts random: prompt lengths in tokens, a comma list")
    p.add_argument("--num-tokens", type=int, default=128,
                   help="decode tokens timed (--prompts text: the most tokens generated)")
    p.add_argument("--compare", default="", choices=["", "hf"],
                   help="'hf': also time HF transformers generate on the same weights")
    p.add_argument("--name", default="latency")
    p.add_argument("--prompts", default="random", choices=["random", "text"],
                   help="random token ids at --contexts, or real text prompts (see above)")
    p.add_argument("--compare-speculative", action="store_true",
                   help="--prompts text: run every prompt with --speculative-config and "
                        "without it")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per prompt (or context) and setting; the median is kept "
                        "(default: 3)")
    p.add_argument("--graphs", default="both", choices=["both", "on", "off"],
                   help="--prompts random: time with CUDA graphs, without, or both (default; "
                        "on a CPU only without: there are no graphs)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give at least 1")
    args.max_num_seqs = min(args.max_num_seqs, 8)
    if args.prompts == "text":
        loaded, name = load(args)
        results, lines = run_text(args, loaded, name)
        path = write_results(args.out, args.name, results)
        print()
        print("\n".join(lines))
        print(f"results: {path}")
        return 0
    args.max_model_len = max(args.max_model_len,
                             max(int(c) for c in args.contexts.split(",")) + args.num_tokens + 16)
    model, name = load(args)
    if args.compare == "hf" and not isinstance(model, LoadedModel):
        raise ValueError("--compare hf needs the model in this process: leave "
                         "--tensor-parallel-size at 1 and the executor backend at auto or uni")
    contexts = [int(c) for c in args.contexts.split(",")]
    print(_start_line(name, contexts, args, resolve_device(args.device)), flush=True)
    g = torch.Generator().manual_seed(0)
    prompts = {c: torch.randint(0, 10000, (c,), generator=g).tolist() for c in contexts}
    results = []
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.graphs]
    if resolve_device(args.device).type != "cuda":
        if args.graphs == "on":
            raise ValueError("--graphs on needs CUDA (graphs capture GPU work); on a CPU use "
                             "--graphs off or both")
        modes = (False,)
    for graphs in modes:
        llm = make_llm(model, args, enforce_eager=not graphs)
        decode_ms_per_token(llm, prompts[contexts[0]][:64], 8)  # warm-up
        for c in contexts:
            ms = statistics.median(decode_ms_per_token(llm, prompts[c], args.num_tokens)
                                   for _ in range(args.repeats))
            results.append({"system": "pagedrt", "workload": f"{name} batch1 ctx{c}",
                            "cuda_graphs": graphs, "ms_per_token": ms,
                            "num_scheduler_steps": llm.llm_engine.config.num_scheduler_steps,
                            "multi_step_max_num_seqs":
                                llm.llm_engine.config.multi_step_max_num_seqs,
                            "tensor_parallel_size": llm.llm_engine.executor.tp_size,
                            "worker_processes": llm.llm_engine.model_runner is None,
                            "output_tok_s": 1e3 / ms})
        free_llm(llm)
    if args.compare == "hf":
        hf = hf_model_like(model, next(model.model.parameters()).dtype,
                           next(model.model.parameters()).device)
        for c in contexts:
            ms = hf_ms_per_token(hf, prompts[c], min(args.num_tokens, 64))
            results.append({"system": "hf-generate", "workload": f"{name} batch1 ctx{c}",
                            "ms_per_token": ms, "output_tok_s": 1e3 / ms})
        del hf
    path = write_results(args.out, args.name, results)
    width = max([30] + [len(r["workload"]) for r in results])  # (a model file's long name)
    print(f"\n{'system':<12} {'workload':<{width}} {'graphs':>6} {'ms/token':>9} {'tok/s':>8}")
    for r in results:
        print(f"{r['system']:<12} {r['workload']:<{width}} {r.get('cuda_graphs', '-')!s:>6} "
              f"{r['ms_per_token']:>9.3f} {r['output_tok_s']:>8.1f}")
    print(f"results: {path}")
    return 0
