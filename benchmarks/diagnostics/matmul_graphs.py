"""Device time of the decode CUDA graph with the tiled decode matmul (pagedrt/ops/
matmul_triton.py) on and off, in one process: engines over the same random Qwen2-0.5B
weights, one built with the path (its start-up timing choosing per shape), one with cuBLAS
only, and optionally one without RoPE in the QKV matmul's epilogue (PAGEDRT_FUSED_ROPE=0)
or one whose candidates leave out the narrow whole-K tiles (`CONFIGS`' four whole-K entries
of 16 weight rows; "wide");
for each batch size N, N requests of 512 prompt tokens are brought into decode on each engine
and its N-row decode graph is replayed (its static inputs hold that engine's last real step),
the engines alternated ABC CBA. A diagnostic for issue 16, not a benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/matmul_graphs.py [--batch-sizes 8,32,64,128]
        [--variants on,off[,norope][,wide]]

Each engine times its own choices (the choice table is cleared before each is built): run it
with PAGEDRT_CONFIG_CACHE=off, or the second engine reads the first one's choices from disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from pagedrt import LLM, SamplingParams
from pagedrt.bench.presets import get_preset, random_model
from pagedrt.ops import gemv_rope_triton, matmul_rope_triton, matmul_triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from profile_step import cuda_ms  # benchmarks/profile_step.py


def replay_us(graph, iters: int = 50) -> float:
    """Median device time of one replay, us (`cuda_ms` of benchmarks/profile_step.py)."""
    return 1e3 * cuda_ms(graph.replay, iters)


def into_decode(llm, n: int, tag: str) -> None:
    """n requests of 512 tokens, stepped until every one has decoded a few tokens."""
    engine = llm.llm_engine
    g = torch.Generator().manual_seed(n)
    for i in range(n):
        engine.add_request(f"{tag}{i}", torch.randint(0, 10000, (512,), generator=g).tolist(),
                           SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=3000),
                           stream=False)
    while engine.scheduler.waiting or any(r.num_output_tokens < 4 for r in engine.scheduler.running):
        engine.step()
    torch.cuda.synchronize()


# matmul_triton.ENABLED, gemv_rope_triton.ENABLED
VARIANTS = {"off": (False, True), "on": (True, True), "norope": (True, False),
            "wide": (True, True)}
# the candidate lists as imported, and the narrow whole-K tiles that "wide" leaves out
LISTS = (matmul_triton.CONFIGS, matmul_triton.SILU_CONFIGS, matmul_rope_triton.CONFIGS)
FULL = [list(v) for v in LISTS]
NARROW = [c for c in matmul_triton.CONFIGS if c[1] == 16 and len(c) == 6]


def set_variant(name: str) -> None:
    """The variant's switches and candidate lists (changed in place: `_choice`'s default
    argument is the CONFIGS list itself), with the choices timed so far forgotten."""
    matmul_triton.ENABLED, gemv_rope_triton.ENABLED = VARIANTS[name]
    for target, full in zip(LISTS, FULL, strict=True):
        target[:] = [c for c in full if name != "wide" or c not in NARROW]
    matmul_triton._CHOICE.clear()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", default="8,32,64,128")
    p.add_argument("--variants", default="on,off",
                   help="engines to build, of off (cuBLAS), on (the default path) and norope "
                        "(the path without RoPE in the QKV epilogue)")
    args = p.parse_args()
    sizes = [int(v) for v in args.batch_sizes.split(",")]
    names = args.variants.split(",")
    model = random_model(get_preset("qwen2-0.5b"), torch.bfloat16, torch.device("cuda"))
    llms = {}
    for name in names:
        set_variant(name)
        llms[name] = LLM(model, max_num_seqs=max(sizes), max_model_len=4096,
                         num_kv_blocks=8192)
        chosen = {k: v for k, v in matmul_triton._CHOICE.items() if v is not None}
        print(f"{name}: {len(chosen)} of {len(matmul_triton._CHOICE)} timed shapes took the "
              "kernel", flush=True)
        for k, v in sorted(chosen.items(), key=str):
            print(f"  {k} -> {v}")
    rows = []
    for n in sizes:
        for name in names:
            into_decode(llms[name], n, f"b{n}_")
        graphs = {name: llms[name].llm_engine.model_runner.graph_runner.graphs[1, n]
                  for name in names}
        t = {name: [] for name in names}
        for name in names + names[::-1]:  # ABC CBA
            t[name].append(replay_us(graphs[name]))
        for name in names:
            for i in range(n):
                llms[name].llm_engine.abort_request(f"b{n}_{i}")
        rows.append((n, {name: statistics.mean(v) for name, v in t.items()}))
    base = "off" if "off" in names else names[0]
    print("rows  " + "  ".join(f"{name:>8s} us" for name in names) + f"  (ratios to {base})")
    for n, us in rows:
        print(f"{n:4d}  " + "  ".join(f"{us[name]:11.1f}" for name in names) + "  "
              + " ".join(f"{us[name] / us[base]:.3f}" for name in names))


if __name__ == "__main__":
    main()
