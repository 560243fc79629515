"""Why a prefill step over an FP8 cache takes longer than over bf16 (Llama-3-8B shape, 16,384
tokens per step: 543 against 425 ms at 065549c, benchmarks/results/RUNS.md, "Runs of
2026-12-02 (11:50-12:30 UTC)"), in two parts. A one-off diagnostic for issue 17, not a
benchmark of record.

1. The attention kernels of a mixed step (CUDA-graph replays, medians): 4 prompts of 4,096
   tokens prefilled whole, with 0, 48 or 96 decode rows of 4,200 tokens of context in the
   same extend launch (as the engine batches them), over a bf16 and an FP8 cache; and the
   decode kernel over those rows alone (what running them apart would cost).
2. The device time by kernel of one engine prefill of 8 prompts x 4,096 tokens (two
   16,384-token steps, no decode rows) with each cache dtype (torch.profiler), to find any
   other kernel that differs.
3. Which Triton kernels compile inside a timed run after the bench's warm-up of 4 requests
   (the FP8 run of 256 x 4,096 / 256 had steps of 8.6, 6.8 and 6.3 s): 16 requests of
   4,096 / 32 over an FP8 cache after 4 warm-up requests, each compile logged through
   triton's jit_post_compile_hook (where this Triton has it).

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/fp8_prefill_step.py --out DIR

With --narrow, instead: the extend launch of 4 x 4,096 prompts with 0 and 96 decode rows,
bf16 and FP8 (the prompts' rows), with the decode rows on their narrow tile and on the wide
one (PAGEDRT_EXTEND_NARROW_DECODE=1 / 0).

With --sweep, instead: the pure 4 x 4,096 prefill's attention under each of a list of launch
configs (BLOCK_M / BLOCK_N / warps / stages), bf16 against FP8 with the prompts' rows and FP8
from the cache, with each compiled kernel's registers and spills (the first run, at 065549c,
measured FP8 with rows 2.4x bf16's time although that path reads no fp8).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from pagedrt import LLM, SamplingParams
from pagedrt.bench.attention import bench_ms, fp8_cache
from pagedrt.bench.common import kernel_device_times
from pagedrt.bench.presets import get_preset, random_model
from pagedrt.ops import attention_triton as tri
from pagedrt.ops.triton_utils import to_v_dim_major

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
CUDA = torch.device("cuda")


def _kernel_resources() -> str:
    """Registers and spills of the extend kernel compiled last (Triton's in-process cache)."""
    try:
        caches = tri._extend_kernel.device_caches
        kernels = [k for dev in caches.values() for k in dev[0].values()]
        k = kernels[-1]
        return f"regs {k.n_regs} spills {k.n_spills} shared {k.metadata.shared}"
    except Exception as e:  # noqa: BLE001 - a diagnostic: report what failed
        return f"({type(e).__name__})"


def mixed_step(num_decode: int, prompt_len: int = 4096, num_prompts: int = 4,
               decode_ctx: int = 4200, configs: list | None = None,
               extend_only: bool = False) -> dict:
    lens = [prompt_len] * num_prompts + [decode_ctx] * num_decode
    q_lens = [prompt_len] * num_prompts + [1] * num_decode
    per_seq = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(per_seq)
    shape = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    k16 = torch.randn(shape, device=CUDA, dtype=torch.bfloat16)
    v16 = torch.randn(shape, device=CUDA, dtype=torch.bfloat16)
    perm = torch.randperm(num_blocks, device=CUDA)
    bt = torch.zeros(len(lens), max(per_seq), dtype=torch.int32, device=CUDA)
    used = 0
    for i, nb in enumerate(per_seq):
        bt[i, :nb] = perm[used:used + nb].int()
        used += nb
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=CUDA)
    tokens = sum(q_lens)
    query = torch.randn(tokens, HEADS, HEAD_DIM, device=CUDA, dtype=torch.bfloat16)
    rows = [torch.randn(tokens, KV_HEADS, HEAD_DIM, device=CUDA, dtype=torch.bfloat16)
            for _ in range(2)]
    scale = HEAD_DIM ** -0.5
    (k8, ks), (v8, vs) = fp8_cache(k16), fp8_cache(v16)
    v8 = to_v_dim_major(v8)
    out = {"num_decode": num_decode}
    if configs:
        sweep = []
        for m, n, w, st in configs:
            cfg = {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}
            row = [f"{m}/{n}/{w}/{st}"]
            for name, kw in (("bf16", None), ("fp8 rows", "rows"), ("fp8 cache", "cache")):
                caches = (k16, v16, {}) if kw is None else (k8, v8, {
                    "k_scales": ks, "v_scales": vs,
                    **({"key": rows[0], "value": rows[1]} if kw == "rows" else {})})
                try:
                    ms = bench_ms(lambda c=caches, cfg=cfg: tri.paged_attention_extend_triton(
                        query, c[0], c[1], bt, cu, seq_lens, scale, max_query_len=prompt_len,
                        config=cfg, **c[2]))
                    row.append(f"{name} {ms:7.3f} ms ({_kernel_resources()})")
                except Exception as e:  # noqa: BLE001 - out of resources and the like
                    row.append(f"{name} ERR {str(e)[:60]}")
            sweep.append(row)
        out["sweep"] = sweep
        return out
    out["bf16_ms"] = bench_ms(lambda: tri.paged_attention_extend_triton(
        query, k16, v16, bt, cu, seq_lens, scale, max_query_len=prompt_len))
    out["fp8_rows_ms"] = bench_ms(lambda: tri.paged_attention_extend_triton(
        query, k8, v8, bt, cu, seq_lens, scale, max_query_len=prompt_len, k_scales=ks,
        v_scales=vs, key=rows[0], value=rows[1]))
    if extend_only:
        torch.cuda.empty_cache()
        return out
    out["fp8_cache_ms"] = bench_ms(lambda: tri.paged_attention_extend_triton(
        query, k8, v8, bt, cu, seq_lens, scale, max_query_len=prompt_len, k_scales=ks,
        v_scales=vs))
    if num_decode:
        dq = torch.randn(num_decode, HEADS, HEAD_DIM, device=CUDA, dtype=torch.bfloat16)
        dbt, dlens = bt[num_prompts:], seq_lens[num_prompts:]
        out["decode_bf16_ms"] = bench_ms(lambda: tri.paged_attention_decode_triton(
            dq, k16, v16, dbt, dlens, scale))
        out["decode_fp8_ms"] = bench_ms(lambda: tri.paged_attention_decode_triton(
            dq, k8, v8, dbt, dlens, scale, k_scales=ks, v_scales=vs))
    torch.cuda.empty_cache()
    return out


def engine_kernels(kv_cache_dtype: str) -> dict:
    model = random_model(get_preset("llama3-8b"), torch.bfloat16, CUDA)
    llm = LLM(model, kv_cache_dtype=kv_cache_dtype, gpu_memory_utilization=0.5,
              max_num_seqs=64, max_num_batched_tokens=16384, max_model_len=4352)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=2)

    def prompts(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 10000, (8, 4096), generator=g).tolist()

    llm.generate(prompts(1), params, use_tqdm=False)  # compile
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts(2), params, use_tqdm=False)
        torch.cuda.synchronize()
    kernels = kernel_device_times(prof, 80)
    del llm, model
    torch.cuda.empty_cache()
    return kernels


def compiles_in_a_run(kv_cache_dtype: str) -> list:
    """Kernels compiled during a run of mixed prefill/decode steps after a 4-request warm-up."""
    import time

    import triton

    log: list = []
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    if knobs is None or not hasattr(knobs, "jit_post_compile_hook"):
        return ["this Triton has no jit_post_compile_hook"]

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled, **kw):
        log.append([round(time.perf_counter() - start, 2), fn.name, str(repr)[:300]])
        return False

    model = random_model(get_preset("llama3-8b"), torch.bfloat16, CUDA)
    llm = LLM(model, kv_cache_dtype=kv_cache_dtype, gpu_memory_utilization=0.5,
              max_num_seqs=64, max_num_batched_tokens=16384, max_model_len=4352)
    g = torch.Generator().manual_seed(3)
    warm = torch.randint(0, 10000, (4, 4096), generator=g).tolist()
    timed = torch.randint(0, 10000, (16, 4096), generator=g).tolist()
    llm.generate(warm, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=32),
                 use_tqdm=False)
    start = time.perf_counter()
    knobs.jit_post_compile_hook = hook
    try:
        llm.generate(timed, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=32),
                     use_tqdm=False)
    finally:
        knobs.jit_post_compile_hook = None
    log.append([round(time.perf_counter() - start, 2), "(run ends)", ""])
    del llm, model
    torch.cuda.empty_cache()
    return log


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--narrow", action="store_true")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.narrow:
        rows = []
        for flag in ("1", "0"):
            os.environ["PAGEDRT_EXTEND_NARROW_DECODE"] = flag
            for n in (96, 0):
                r = mixed_step(n, extend_only=True)
                rows.append({"narrow": flag, **r})
                print(f"narrow {flag} decode rows {n:3d}: bf16 {r['bf16_ms']:.3f} ms, "
                      f"FP8 (rows) {r['fp8_rows_ms']:.3f} ms", flush=True)
        with open(os.path.join(args.out, "fp8_prefill_narrow.json"), "w") as f:
            json.dump(rows, f, indent=1)
        return
    if args.sweep:
        configs = [(256, 64, 8, 3), (256, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 2),
                   (128, 128, 8, 2), (256, 32, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3)]
        result = mixed_step(0, configs=configs)
        with open(os.path.join(args.out, "fp8_prefill_sweep.json"), "w") as f:
            json.dump(result, f, indent=1)
        for row in result["sweep"]:
            print(" | ".join(row))
        return
    steps = [mixed_step(n) for n in (0, 48, 96)]
    engines = {dt: engine_kernels(dt) for dt in ("auto", "fp8")}
    compiles = compiles_in_a_run("fp8")
    with open(os.path.join(args.out, "fp8_prefill_step.json"), "w") as f:
        json.dump({"mixed_steps": steps, "engine_kernels_us": engines,
                   "compiles_in_fp8_run": compiles}, f, indent=1)
    print("compiled inside the FP8 run (s from its start, kernel):")
    for t, name, _ in compiles:
        print(f"  {t:7.2f} {name}")
    for dt, ks in engines.items():
        total = sum(v[1] for v in ks.values()) / 1e3
        print(f"engine {dt}: device total {total:.1f} ms over 2 prefill steps (+2 decode)")
        for name, (n, us) in list(ks.items())[:8]:
            print(f"  {us / 1e3:8.1f} ms {n:5d}x {name}")
    print("attention of a mixed step (ms): decode rows, bf16, fp8 rows, fp8 from cache, "
          "decode kernel bf16 / fp8 for the rows alone")
    for s in steps:
        print(f"  {s['num_decode']:3d} {s['bf16_ms']:8.3f} {s['fp8_rows_ms']:8.3f} "
              f"{s['fp8_cache_ms']:8.3f} {s.get('decode_bf16_ms', 0):8.3f} "
              f"{s.get('decode_fp8_ms', 0):8.3f}")


if __name__ == "__main__":
    main()
