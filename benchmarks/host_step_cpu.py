"""Host time of an engine decode step on the CPU, with a stub model (no device work): the
scheduler, the model runner's input preparation, the sampler and the update of 256 requests. A
diagnostic for keeping the per-step host work small (every change to the engine's hot path is
compared old/new with it), not a benchmark of record.

    PYTHONPATH=$PWD python benchmarks/host_step_cpu.py [--num-seqs 256] [--steps 200] [--async]
        [--sampling greedy|nanovllm|filters|penalties|mixed] [--seeded] [--churn] [--repeat 3]
        [--n N | --beam-width W] [--cpu-clock] [--staged] [--num-scheduler-steps K]
        [--json FILE]

Sampling settings (one SamplingParams object per request, as an API server makes them):
  greedy     temperature 0
  nanovllm   temperature 0.6 (nano-vllm's bench.py)
  filters    temperature 0.8, top_k 20, top_p 0.9, min_p 0.05
  penalties  temperature 0.8, repetition 1.1, frequency 0.2, presence 0.1
  mixed      the four above in turn, and every third request min_tokens = max_tokens / 2
--seeded gives every request a seed (a per-request generator).
--churn: twice --num-seqs requests, each with max_tokens drawn from [16, --steps], so that
sequences leave and waiting ones join (with their prefill) throughout the timed steps, as in
nano-vllm's workload; the figures are then over every step, not decodes only.

Groups (issue 20: beam search against n-sampling of the same shape): --beam-width W runs
--num-seqs / W beam searches of width W (ignore_eos, so every search runs its max_tokens), and
--n N the same number of prompts with n = N samples each at temperature 1 (as
`pagedrt bench throughput --beam-width` does); either way --num-seqs rows per decode step. In
these modes the stub's logits row depends on the row's input token (a fixed random row per
token id), so that the beams of a search differ and their choice moves slots as a model's
would.

The stub model returns zeros as hidden states and one fixed random logits row per token; the
engine around it is the real one. On this CPU the sampler's tensor ops run here too, on a
--vocab-size-wide logits batch (small, so that they stay a small part of the figure; on a GPU
they are launches). Prints, per repeat, the median and the 25th/75th percentiles of the wall
time of `LLMEngine.step()` in ms over decode steps of `--num-seqs` rows, after every request
has finished its prefill, the mean CPU time of the process per step (less sensitive to other
processes on a shared machine), per phase of the step (`StepClock`: schedule, prepare,
forward, sample, update) the mean wall time per step and, in brackets, the median (robust to
the odd step slowed by other processes; `phases_median_ms` in the JSON), and then, over 20 more
steps, the tensor ops per step of each phase (views left out): on a GPU most of them are kernel
launches, whose host cost this CPU run does not show. --cpu-clock measures the step and its
phases in this thread's CPU time instead of wall time (steadier on a machine shared with other
work; torch runs on this thread alone here).

On the CPU the sample phase also does the tensor ops' work, which a GPU does: for beam search
that includes copying every slot's partial KV block each step (`KVCache.gather_copy_blocks`,
about half of that phase here with the stub's 2 layers).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pagedrt.config import EngineConfig, ModelConfig
from pagedrt.engine import profiling
from pagedrt.engine.llm_engine import LLMEngine
from pagedrt.models.loader import LoadedModel
from pagedrt.sampling_params import BeamSearchParams, SamplingParams

SAMPLING = {
    "greedy": {"temperature": 0.0},
    "nanovllm": {"temperature": 0.6},
    "filters": {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
    "penalties": {"temperature": 0.8, "repetition_penalty": 1.1, "frequency_penalty": 0.2,
                  "presence_penalty": 0.1},
}


def stub_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=vocab_size, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
    )


class StubModel(torch.nn.Module):
    """The model interface the engine calls, with no work behind it. token_logits: each row's
    logits are a fixed random row chosen by its input token (else by its position in the
    batch)."""

    def __init__(self, config: ModelConfig, max_tokens: int = 16384, max_rows: int = 1024,
                 token_logits: bool = False) -> None:
        super().__init__()
        self.config = config
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        gen = torch.Generator().manual_seed(0)
        self.token_logits = token_logits
        rows = config.vocab_size if token_logits else max_rows
        self.table = torch.randn(rows, config.vocab_size, generator=gen) * 3
        self.hidden = torch.zeros(max_tokens, config.hidden_size)

    def forward(self, input_ids, positions, kv_layers, meta):
        hidden = self.hidden[: input_ids.shape[0]]
        if self.token_logits:  # the input token rides in the hidden state's first element
            hidden = hidden.clone()
            hidden[:, 0] = input_ids.float()
        return hidden

    def compute_logits(self, hidden):
        if self.token_logits:
            return self.table.index_select(0, hidden[:, 0].long())
        return self.table[: hidden.shape[0]]


def _max_tokens(args) -> int:
    """A request's max_tokens without --churn: every timed step decodes it, bursts included."""
    return (args.steps + 64) * args.num_scheduler_steps


def request_params(args, i: int, rng: random.Random) -> SamplingParams:
    if args.beam_width:
        return BeamSearchParams(beam_width=args.beam_width, max_tokens=args.steps + 64,
                                ignore_eos=True).to_sampling_params()
    if args.n:
        return SamplingParams(n=args.n, temperature=1.0, ignore_eos=True,
                              max_tokens=args.steps + 64, seed=i if args.seeded else None)
    kinds = list(SAMPLING) if args.sampling == "mixed" else [args.sampling]
    max_tokens = rng.randint(16, args.steps) if args.churn else _max_tokens(args)
    kwargs = dict(SAMPLING[kinds[i % len(kinds)]])
    if args.sampling == "mixed" and i % 3 == 0:
        kwargs["min_tokens"] = max_tokens // 2
    return SamplingParams(ignore_eos=True, max_tokens=max_tokens,
                          seed=i if args.seeded else None, **kwargs)


def stage_for_graphs(engine: LLMEngine) -> None:
    """Give the engine's model runner a graph runner whose "replays" run eagerly, with staged
    decode inputs (pagedrt/ops/graph_inputs.py): the host work of the CUDA decode path."""
    from pagedrt.engine.cuda_graphs import CUDAGraphRunner

    os.environ["PAGEDRT_STAGED_GRAPH_INPUTS"] = "1"
    mr = engine.model_runner
    mr.graph_runner = CUDAGraphRunner(
        mr.model, mr.kv_cache.layers, mr.max_num_seqs,
        -(-mr.batch.max_model_len // mr.block_size), mr.device, "torch",
        block_size=mr.block_size, capture_graphs=False)
    assert mr.graph_runner.staged_inputs


def run(args) -> dict:
    clock = time.thread_time if args.cpu_clock else time.perf_counter
    profiling.time = _CpuClock if args.cpu_clock else time  # the engine's StepClock
    config = stub_config(args.vocab_size)
    span = _max_tokens(args)
    cfg = EngineConfig(num_kv_blocks=args.num_seqs * (-(-(args.input_len + span) // 16) + 1),
                       max_num_seqs=args.num_seqs, max_num_batched_tokens=8192,
                       async_scheduling=args.async_scheduling,
                       num_scheduler_steps=args.num_scheduler_steps)
    group = args.beam_width or args.n or 1
    model = StubModel(config, token_logits=group > 1)
    engine = LLMEngine(config=cfg, device="cpu",
                       loaded=LoadedModel(model, config, None, "stub"))
    if args.staged:
        stage_for_graphs(engine)
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for i in range(args.num_seqs * (2 if args.churn else 1) // group):
        prompt = torch.randint(0, config.vocab_size, (args.input_len,), generator=gen)
        engine.add_request(str(i), prompt.tolist(), request_params(args, i, rng), stream=False)
    while not args.churn and (engine.scheduler.waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running)):
        engine.step()
    for _ in range(40 if args.churn else 10):  # (churn: past the first prefills)
        engine.step()
    engine.clock.reset()
    totals = engine.clock.totals
    times, cpu_times, per_step = [], [], []
    for _ in range(args.steps):
        before = dict(totals)
        t, c = clock(), time.process_time()
        engine.step()
        times.append(1e3 * (clock() - t))
        cpu_times.append(1e3 * (time.process_time() - c))
        per_step.append({k: 1e3 * (v - before.get(k, 0.0)) for k, v in totals.items()})
    q = statistics.quantiles(times, n=4)
    phases = {k: 1e3 * v / args.steps for k, v in engine.clock.totals.items()}
    return {"median_ms": statistics.median(times), "p25_ms": q[0], "p75_ms": q[2],
            "cpu_ms": statistics.mean(cpu_times), "phases_ms": phases,
            "phases_median_ms": {k: statistics.median(step.get(k, 0.0) for step in per_step)
                                 for k in totals},
            "tensor_ops": count_ops(engine, OP_COUNT_STEPS)}


OP_COUNT_STEPS = 20


class _CpuClock:
    """Stands for the `time` module in pagedrt.engine.profiling with --cpu-clock."""

    perf_counter = staticmethod(time.thread_time)


class _OpCounter(TorchDispatchMode):
    """Counts the tensor ops dispatched (views and aliases left out: they launch nothing),
    by the engine phase they ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.current = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.current += 1
        return func(*args, **(kwargs or {}))


def count_ops(engine, steps: int) -> dict[str, float]:
    """Tensor ops per step by phase, over `steps` more steps (untimed: counting slows them).
    On the CPU every one of them is host work; on a GPU most are kernel launches (about 5 to
    10 us of host time each), so this is the figure that carries over."""
    counter = _OpCounter()
    clock = engine.clock
    mark = clock.mark

    def counted_mark(phase: str) -> None:
        counter.counts[phase] = counter.counts.get(phase, 0) + counter.current
        counter.current = 0
        mark(phase)

    clock.mark = counted_mark
    try:
        with counter:
            for _ in range(steps):
                engine.step()
    finally:
        del clock.mark
    return {k: v / steps for k, v in counter.counts.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument("--async", dest="async_scheduling", action="store_true")
    p.add_argument("--sampling", default="greedy", choices=[*SAMPLING, "mixed"])
    p.add_argument("--seeded", action="store_true")
    p.add_argument("--churn", action="store_true",
                   help="sequences leave and join during the timed steps (see above)")
    p.add_argument("--n", type=int, default=0,
                   help="n samples per prompt at temperature 1 (--num-seqs / n prompts)")
    p.add_argument("--beam-width", type=int, default=0,
                   help="beam search of this width (--num-seqs / width prompts)")
    p.add_argument("--cpu-clock", action="store_true",
                   help="time in this thread's CPU time, not wall time")
    p.add_argument("--staged", action="store_true",
                   help="decode steps staged for a graph runner whose replays run eagerly "
                        "(the CUDA path's host work; its forward phase then holds the "
                        "scatter's torch reference, which a GPU runs inside the graph)")
    p.add_argument("--num-scheduler-steps", type=int, default=1,
                   help="multi-step decode: up to K passes a plan (a step's figures are then "
                        "a burst's; the phases per token are the figures / K)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", default="", help="also write every repeat's figures here")
    args = p.parse_args()
    if args.n and args.beam_width:
        p.error("give --n or --beam-width, not both")
    group = args.beam_width or args.n or 1
    if args.num_seqs % group:
        p.error(f"--num-seqs {args.num_seqs} is not a multiple of {group}")
    mode = (f"beam {args.beam_width}" if args.beam_width else f"n={args.n}" if args.n
            else args.sampling)
    torch.set_num_threads(1)
    results = []
    for _ in range(args.repeat):
        r = run(args)
        results.append({"system": "host_step_cpu", "sampling": mode,
                        "seeded": args.seeded, "churn": args.churn, "num_seqs": args.num_seqs,
                        "async": args.async_scheduling, **r})
        phases = " ".join(f"{k} {v:.3f} ({r['phases_median_ms'][k]:.3f})"
                          for k, v in r["phases_ms"].items())
        ops = " ".join(f"{k} {v:.0f}" for k, v in r["tensor_ops"].items())
        print(f"{mode}{' seeded' if args.seeded else ''}"
              f"{', churn' if args.churn else ''}, {args.num_seqs} rows "
              f"({'async' if args.async_scheduling else 'sync'}"
              f"{', CPU clock' if args.cpu_clock else ''}): median {r['median_ms']:.3f} ms "
              f"(p25 {r['p25_ms']:.3f}, p75 {r['p75_ms']:.3f}); CPU {r['cpu_ms']:.3f} ms/step; "
              f"phases {phases}; tensor ops per step: {ops}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results}, f, indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
