"""`pagedrt bench throughput --beam-width W`: beam search against sampling and HF transformers.

Workload: the fixed one (--num-requests prompts of --input-len random token ids), --output-len
new tokens, ignore_eos (every sequence runs to the end). On the same prompts:

  pagedrt beam W   LLM.beam_search, width W (output tokens: W x output_len per prompt, the W
                   sequences returned; each step computes W tokens per prompt)
  pagedrt n=W      sampling (temperature 1) of n = W samples per prompt: as many tokens
  hf beam W        HF `generate(num_beams=W, do_sample=False)`, static batches of the largest
                   of --hf-batch-sizes that fits in memory (W x output_len per prompt too)

Each pagedrt run has a warm-up of the same shapes on other token ids first (8 tokens); beam
search and sampling are then timed in turn, `REPEATS` times each, and the median run is
reported, with its step trace (decode step wall and device time, `throughput.summarize_trace`,
and the host's time per phase of a decode step, averaged: on a host-bound step these say where
the time goes). On CUDA a last, untimed run of 16 tokens each under CUDA's sync debug mode
counts the host's waits for the device per decode step (`device_waits`: with async
scheduling there should be none but the engine's own wait for the previous step's tokens,
which the mode does not flag) and the pinned host allocations, which can wait too.
"""

from __future__ import annotations

import time

import torch

from pagedrt.bench.common import hf_model_like, sync
from pagedrt.sampling_params import BeamSearchParams, SamplingParams

REPEATS = 3


def beam_params(args, max_tokens: int) -> SamplingParams:
    return BeamSearchParams(beam_width=args.beam_width, max_tokens=max_tokens,
                            ignore_eos=True).to_sampling_params()


def sampling_params(args, max_tokens: int) -> SamplingParams:
    return SamplingParams(n=args.beam_width, temperature=1.0, max_tokens=max_tokens,
                          ignore_eos=True)


def warm_up(llm, prompts, params: SamplingParams) -> None:
    warm = torch.randint(0, 10000, (len(prompts), len(prompts[0])),
                         generator=torch.Generator().manual_seed(7)).tolist()
    llm.generate(warm, _with_max_tokens(params, 8), use_tqdm=False)


def run_engine(llm, prompts, params: SamplingParams, system: str, workload: str) -> dict:
    """One timed LLM.generate (beam search or n-sampling) with its step trace."""
    from pagedrt.bench.throughput import summarize_trace, timed_generate, trace_steps

    engine = llm.llm_engine
    engine.reset_stats()
    trace, finish = trace_steps(engine)
    elapsed, num_steps, outs = timed_generate(llm, prompts, params)
    finish()
    n_out = sum(len(o.token_ids) for out in outs for o in out.outputs)
    stats = llm.stats()
    decode = [r for r in trace if r[1] and r[2] == r[1]]
    host_ms = {k: sum(r[4].get(k, 0.0) for r in decode) / max(len(decode), 1)
               for k in ("schedule", "prepare", "forward", "sample", "update")}
    return {"system": system, "workload": workload, "num_requests": len(prompts),
            "output_tokens": n_out, "elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
            "num_steps": num_steps, "ms_per_step": 1e3 * elapsed / max(num_steps, 1),
            "step_times": summarize_trace(trace), "decode_host_ms_mean": host_ms,
            "step_trace": trace, "async_scheduling": engine.async_scheduling,
            "kv_peak_used_blocks": stats["peak_used_blocks"],
            "kv_num_blocks": stats["num_blocks"], "peak_batch_size": stats["peak_batch_size"],
            "num_preemptions": stats["num_preemptions"]}


def device_waits(llm, prompts, params: SamplingParams) -> dict:
    """Synchronizing CUDA calls per decode step (CUDA's sync debug mode, "warn") and pinned
    host allocations (cudaHostAlloc) over a run of `params` with 16 tokens; {} off CUDA.
    A decode step: every scheduled request computes one token and none forks."""
    import warnings

    engine = llm.llm_engine
    if engine.device.type != "cuda":
        return {}
    host_stats = getattr(torch.cuda, "host_memory_stats", None)

    def host_allocs() -> int | None:
        try:
            return host_stats().get("num_host_alloc") if host_stats is not None else None
        except RuntimeError:
            return None

    syncs: list[str] = []
    decode_steps = [0]
    step = engine.step

    def counted_step():
        out = step()
        plan = engine.last_scheduler_output
        if plan.req_ids and plan.total_num_tokens == len(plan.req_ids) and not plan.forks:
            decode_steps[0] += 1
        return out

    def record(message, category, filename, lineno, file=None, line=None):
        plan = engine.last_scheduler_output
        if ("synchroniz" in str(message).lower() and plan.req_ids
                and plan.total_num_tokens == len(plan.req_ids) and not plan.forks):
            syncs.append(str(message)[:160])

    before = host_allocs()
    engine.step = counted_step
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                llm.generate(prompts, _with_max_tokens(params, 16), use_tqdm=False)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        del engine.step
    after = host_allocs()
    return {"syncs_per_decode_step": len(syncs) / max(decode_steps[0], 1),
            "sync_warnings_first": syncs[:3],
            "pinned_host_allocs": None if before is None or after is None else after - before}


def _with_max_tokens(params: SamplingParams, max_tokens: int) -> SamplingParams:
    beam = params.beam_search
    if beam is None:
        return SamplingParams(n=params.n, temperature=params.temperature,
                              max_tokens=max_tokens, ignore_eos=True)
    return BeamSearchParams(beam.beam_width, max_tokens, ignore_eos=True).to_sampling_params()


def run_hf_beam(loaded, prompts, args, workload: str) -> dict:
    """HF generate(num_beams=W) over all prompts in static batches: the largest batch size of
    --hf-batch-sizes that runs without running out of memory."""
    device = next(loaded.model.parameters()).device
    hf = hf_model_like(loaded, next(loaded.model.parameters()).dtype, device)
    width, out_len = args.beam_width, args.output_len
    tried = []
    try:
        for bs in sorted(set(args.hf_batch_sizes), reverse=True):
            bs = min(bs, len(prompts))
            try:
                gen = _hf_generate(hf, prompts[:bs], width, 2)  # warm-up at this shape
                del gen
                sync(device)
                t = time.perf_counter()
                n_out = 0
                for i in range(0, len(prompts), bs):
                    ids = torch.tensor(prompts[i:i + bs], device=device)
                    gen = _hf_generate(hf, prompts[i:i + bs], width, out_len)
                    n_out += (gen.shape[1] - ids.shape[1]) * ids.shape[0] * width
                sync(device)
                elapsed = time.perf_counter() - t
                return {"system": "hf-beam", "workload": f"{workload} batch{bs}",
                        "num_requests": len(prompts), "batch_size": bs, "output_tokens": n_out,
                        "elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
                        "batch_sizes_out_of_memory": tried}
            except torch.OutOfMemoryError:
                tried.append(bs)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        return {"system": "hf-beam", "workload": workload,
                "error": f"out of memory at every batch size {tried}"}
    finally:
        del hf
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _hf_generate(hf, prompts, width: int, max_new_tokens: int) -> torch.Tensor:
    ids = torch.tensor(prompts, device=hf.device)
    return hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=width,
                       do_sample=False, max_new_tokens=max_new_tokens, early_stopping=False,
                       length_penalty=1.0, eos_token_id=None, pad_token_id=0)


def run(llm, loaded, args, prompts, name: str, workload: str) -> list[dict]:
    """The rows of the comparison (see the module docstring)."""
    w = args.beam_width
    kinds = [(f"pagedrt-beam{w}", beam_params(args, args.output_len)),
             (f"pagedrt-n{w}", sampling_params(args, args.output_len))]
    for _, params in kinds:
        warm_up(llm, prompts, params)
    runs: dict[str, list[dict]] = {system: [] for system, _ in kinds}
    for _ in range(REPEATS):  # in turn, so that a slow patch of the host hits both
        for system, params in kinds:
            runs[system].append(run_engine(llm, prompts, params, system,
                                           f"{name} {workload}"))
    rows = []
    for system, params in kinds:
        ordered = sorted(runs[system], key=lambda r: r["output_tok_s"])
        row = ordered[len(ordered) // 2]
        row["repeats_output_tok_s"] = [r["output_tok_s"] for r in runs[system]]
        row.update(device_waits(llm, prompts, params))
        rows.append(row)
    return rows


def summary(results: list[dict], width: int) -> list[str]:
    """The lines printed last: each row (syncs: synchronizing CUDA calls per decode step,
    pins: pinned host allocations, in the `device_waits` run), then beam search against
    n-sampling and HF."""
    by = {r["system"]: r for r in results}
    beam = by.get(f"pagedrt-beam{width}", {}).get("output_tok_s")
    lines = [(f"{'system':<16} {'workload':<32} {'out tok/s':>10} {'decode ms':>9} "
              f"{'device ms':>9} {'syncs':>5} {'pins':>4}  host ms per decode step")]
    for r in results:
        rate = r.get("output_tok_s")
        st = r.get("step_times", {})
        step, dev = st.get("decode_step_ms_median"), st.get("decode_model_device_ms_median")
        host = " ".join(f"{k[:5]} {v:.2f}" for k, v in r.get("decode_host_ms_mean", {}).items())
        syncs, pins = r.get("syncs_per_decode_step"), r.get("pinned_host_allocs")
        lines.append(f"{r['system']:<16} {r['workload']:<32} "
                     f"{f'{rate:,.0f}' if rate else r.get('error', '?')[:10]:>10} "
                     f"{f'{step:.2f}' if step else '':>9} {f'{dev:.2f}' if dev else '':>9} "
                     f"{'' if syncs is None else f'{syncs:.1f}':>5} "
                     f"{'' if pins is None else pins:>4}  {host}")
    sample = by.get(f"pagedrt-n{width}", {}).get("output_tok_s")
    hf = by.get("hf-beam", {}).get("output_tok_s")
    if beam and sample:
        lines.append(f"beam {width} / n={width} sampling: {beam / sample:.2f}x (target >= 0.8x)")
    if beam and hf:
        lines.append(f"beam {width} / HF generate(num_beams={width}): {beam / hf:.1f}x "
                     "(target >= 10x)")
    return lines
