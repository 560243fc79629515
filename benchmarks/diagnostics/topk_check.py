"""`row_topk_triton` (PAGEDRT_SAMPLER_TOPK_KERNEL; docs/design.md, "Host work per step")
against `torch.topk` at the sampler's shape, 256 x 151,936 logits (bf16 and float32), k of 20
and 50: the values equal, and each one's device time over 20 calls in a CUDA graph. A quick
diagnostic, not a benchmark of record.

    PYTHONPATH=$PWD python3 -u benchmarks/diagnostics/topk_check.py
"""

from __future__ import annotations

import torch

from pagedrt.ops.beam_topk_triton import row_topk_triton


def graph_us(fn, calls: int = 20) -> float:
    """Median device us per call of fn() over 10 replays of a graph of `calls` calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        logits = (torch.randn(256, 151936, device="cuda", generator=g) * 3).to(dtype)
        for k in (20, 50):
            values, _ = row_topk_triton(logits, k)
            same = torch.equal(values, logits.float().topk(k, dim=-1)[0])
            t_torch = graph_us(lambda x=logits, k=k: x.topk(k, dim=-1))
            t_triton = graph_us(lambda x=logits, k=k: row_topk_triton(x, k))
            print(f"{dtype!s:15} k {k:2}: values equal {same}; torch.topk {t_torch:7.1f} us, "
                  f"row_topk_triton {t_triton:7.1f} us ({t_triton / t_torch:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
