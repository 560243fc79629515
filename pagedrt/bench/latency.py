"""`pagedrt bench latency`: batch-1 decode latency (ms per output token) at given contexts,
with and without CUDA graphs, and HF transformers `generate` on the same weights (--compare hf).

ms/token = time of the decode steps after the first token / their number: the prefill of the
context is excluded, so the figure is the per-token cost a streaming user sees.
"""

from __future__ import annotations

import argparse
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
from pagedrt.models.loader import LoadedModel
from pagedrt.sampling_params import SamplingParams


def decode_ms_per_token(llm, prompt: list[int], num_tokens: int) -> float:
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=num_tokens + 1)
    engine.add_request("latency", prompt, params, stream=False)
    engine.step()  # prefill + first token
    sync_engine(engine)
    t = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    sync_engine(engine)
    return 1e3 * (time.perf_counter() - t) / steps


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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pagedrt bench latency", description=__doc__)
    add_model_args(p)
    p.add_argument("--contexts", default="512,4096")
    p.add_argument("--num-tokens", type=int, default=128, help="decode tokens timed")
    p.add_argument("--compare", default="")
    p.add_argument("--name", default="latency")
    args = p.parse_args(argv)
    args.max_num_seqs = min(args.max_num_seqs, 8)
    args.max_model_len = max(args.max_model_len,
                             max(int(c) for c in args.contexts.split(",")) + args.num_tokens + 16)
    model, name = load(args)
    if args.compare == "hf" and not isinstance(model, LoadedModel):
        raise ValueError("--compare hf needs the model in this process: leave "
                         "--tensor-parallel-size at 1 and the executor backend at auto or uni")
    contexts = [int(c) for c in args.contexts.split(",")]
    g = torch.Generator().manual_seed(0)
    prompts = {c: torch.randint(0, 10000, (c,), generator=g).tolist() for c in contexts}
    results = []
    for graphs in (True, False):
        llm = make_llm(model, args, enforce_eager=not graphs)
        decode_ms_per_token(llm, prompts[contexts[0]][:64], 8)  # warm-up
        for c in contexts:
            ms = decode_ms_per_token(llm, prompts[c], args.num_tokens)
            results.append({"system": "pagedrt", "workload": f"{name} batch1 ctx{c}",
                            "cuda_graphs": graphs, "ms_per_token": ms,
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
    print(f"\n{'system':<12} {'workload':<30} {'graphs':>6} {'ms/token':>9} {'tok/s':>8}")
    for r in results:
        print(f"{r['system']:<12} {r['workload']:<30} {r.get('cuda_graphs', '-')!s:>6} "
              f"{r['ms_per_token']:>9.3f} {r['output_tok_s']:>8.1f}")
    print(f"results: {path}")
    return 0
