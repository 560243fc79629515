"""Host time of an engine decode step on the CPU, with a stub model (no device work): the
scheduler, the model runner's input preparation, the sampler's fast path and the update of 256
requests. A diagnostic for keeping the per-step host work small (every change to the engine's
hot path is compared old/new with it), not a benchmark of record.

    PYTHONPATH=$PWD python benchmarks/host_step_cpu.py [--num-seqs 256] [--steps 200] [--async]

The stub model returns zeros as hidden states and one fixed random logits row per token, so
greedy decoding picks tokens in microseconds; the engine around it is the real one. Prints the
median and the 25th/75th percentiles of the wall time of `LLMEngine.step()` in ms over decode
steps of `--num-seqs` rows, after every request has finished its prefill, and the mean CPU
time of the process per step (less sensitive to other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pagedrt.config import EngineConfig, ModelConfig
from pagedrt.engine.llm_engine import LLMEngine
from pagedrt.models.loader import LoadedModel
from pagedrt.sampling_params import SamplingParams

STUB_CONFIG = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=384, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=4096,
)


class StubModel(torch.nn.Module):
    """The model interface the engine calls, with no work behind it."""

    def __init__(self, config: ModelConfig, max_tokens: int = 16384) -> None:
        super().__init__()
        self.config = config
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(config.vocab_size, config.vocab_size, generator=gen)
        self.hidden = torch.zeros(max_tokens, config.hidden_size)

    def forward(self, input_ids, positions, kv_layers, meta):
        return self.hidden[: input_ids.shape[0]]

    def compute_logits(self, hidden):
        return self.table[: hidden.shape[0]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--async", dest="async_scheduling", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = EngineConfig(num_kv_blocks=args.num_seqs * (args.input_len + args.steps + 64) // 16,
                       max_num_seqs=args.num_seqs, max_num_batched_tokens=8192,
                       async_scheduling=args.async_scheduling)
    engine = LLMEngine(config=cfg, device="cpu",
                       loaded=LoadedModel(StubModel(STUB_CONFIG), STUB_CONFIG, None, "stub"))
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.steps + 64)
    for i in range(args.num_seqs):
        prompt = torch.randint(0, STUB_CONFIG.vocab_size, (args.input_len,), generator=gen)
        engine.add_request(str(i), prompt.tolist(), params, stream=False)
    while engine.scheduler.waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    for _ in range(10):
        engine.step()
    times, cpu_times = [], []
    for _ in range(args.steps):
        t, c = time.perf_counter(), time.process_time()
        engine.step()
        times.append(1e3 * (time.perf_counter() - t))
        cpu_times.append(1e3 * (time.process_time() - c))
    q = statistics.quantiles(times, n=4)
    print(f"decode step of {args.num_seqs} rows ({'async' if args.async_scheduling else 'sync'}):"
          f" median {statistics.median(times):.3f} ms (p25 {q[0]:.3f}, p75 {q[2]:.3f}); "
          f"CPU time {statistics.mean(cpu_times):.3f} ms per step")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
