"""Device time by kernel of one run of `bench throughput`'s fixed workload (Qwen2-0.5B preset,
random weights, 256 x 512 in / 128 out, greedy), and the wall time of REPEATS unprofiled
runs in the same process. Uses only the `LLM` API and the bench presets, so the same script
runs against an older tree (PYTHONPATH=that tree) to find which kernels a change made slower.
A one-off diagnostic, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/workload_kernels.py --out F.json [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from pagedrt import LLM, SamplingParams
from pagedrt.bench.common import kernel_device_times
from pagedrt.bench.presets import get_preset, random_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    args = p.parse_args()
    model = random_model(get_preset("qwen2-0.5b"), torch.bfloat16, torch.device("cuda"))
    llm = LLM(model, gpu_memory_utilization=0.85, max_num_seqs=256,
              max_num_batched_tokens=16384, max_model_len=4096)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=args.output_len)

    def prompts(seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 10000, (args.num_requests, args.input_len), generator=g).tolist()

    llm.generate(prompts(100), params, use_tqdm=False)  # warm-up (compiles, graphs)
    walls = []
    for r in range(args.repeats):  # fresh token ids each time: no prefix-cache hits
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts(r + 1), params, use_tqdm=False)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts(50), params, use_tqdm=False)
        torch.cuda.synchronize()
    kernels = kernel_device_times(prof, 90)
    result = {"output_tok_s": [n_out / w for w in walls], "wall_s": walls,
              "output_tok_s_median": n_out / statistics.median(walls),
              "kernels_us": kernels}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.out}: output tok/s {[round(x) for x in result['output_tok_s']]}, device total "
          f"{sum(v[1] for v in kernels.values()) / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
