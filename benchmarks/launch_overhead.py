"""Host time per call of each op of a prefill forward, and of whole engine phases, measured
while the device is kept busy (a long `torch.cuda._sleep` queued first), so that no call can
wait for the device: what is left is launch and Python cost. A tuning diagnostic.

    PYTHONPATH=$PWD python3 benchmarks/launch_overhead.py --out DIR [--tokens N]  # N: k * 512
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from pagedrt.bench.presets import get_preset, random_model
from pagedrt.kv.kv_cache import KVCache, KVCacheSpec
from pagedrt.ops.attention import AttentionMetadata
from pagedrt.ops.attention_extend_triton import paged_attention_extend_triton
from pagedrt.ops.fused_triton import (
    _rms_norm_kernel,
    rms_norm_triton,
    rotary_triton,
    silu_and_mul_triton,
)
from pagedrt.ops.kv_write_triton import write_kv_triton


def host_us(fn, calls: int = 40) -> float:
    """Median host microseconds per call of fn() with the device busy the whole time."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e8))  # ~0.15 s of device time: every call below only enqueues
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(1e6 * (time.perf_counter() - t))
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=16384)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev, dt = torch.device("cuda"), torch.bfloat16
    n = args.tokens
    cfg = get_preset("qwen2-0.5b")
    hidden, heads, kv_heads, hd = (cfg.hidden_size, cfg.num_attention_heads,
                                   cfg.num_key_value_heads, cfg.head_dim)
    x = torch.randn(n, hidden, device=dev, dtype=dt)
    res = torch.randn_like(x)
    w = torch.ones(hidden, device=dev, dtype=dt)
    w_qkv = torch.randn((heads + 2 * kv_heads) * hd, hidden, device=dev, dtype=dt) * 0.02
    b_qkv = torch.zeros(w_qkv.shape[0], device=dev, dtype=dt)
    qkv = F.linear(x, w_qkv, b_qkv)
    q = qkv[:, : heads * hd].view(n, heads, hd)
    k = qkv[:, heads * hd: (heads + kv_heads) * hd].view(n, kv_heads, hd)
    v = qkv[:, (heads + kv_heads) * hd:].view(n, kv_heads, hd)
    pos = torch.arange(n, device=dev) % 512
    cos_sin = torch.randn(4096, hd, device=dev, dtype=torch.float32)
    seq = 512
    num_seqs = max(1, n // seq)
    num_blocks = num_seqs * seq // 16 + 1
    kc = torch.zeros(num_blocks, 16, kv_heads, hd, device=dev, dtype=dt)
    vc = torch.zeros_like(kc)
    slots = torch.arange(n, device=dev)
    tables = torch.arange(num_seqs * seq // 16, device=dev, dtype=torch.int32).view(num_seqs, -1)
    cu = torch.arange(0, n + 1, seq, device=dev, dtype=torch.int32)[: num_seqs + 1]
    lens = torch.full((num_seqs,), seq, device=dev, dtype=torch.int32)
    gate_up = torch.randn(n, 2 * cfg.intermediate_size, device=dev, dtype=dt)
    small = torch.zeros(16, device=dev)
    out, new_res = torch.empty_like(x), torch.empty_like(x)

    def raw_rms():
        _rms_norm_kernel[(n,)](x, res, w, out, new_res, x.stride(0), res.stride(0), hidden,
                               1e-6, BLOCK=1024, HAS_RESIDUAL=True, num_warps=4)

    ops = {
        "torch add_ (reference)": lambda: small.add_(1),
        "torch empty": lambda: torch.empty(n, hidden, device=dev, dtype=dt),
        "F.linear qkv (bias)": lambda: F.linear(x, w_qkv, b_qkv),
        "rms_norm_triton (residual)": lambda: rms_norm_triton(x, w, 1e-6, res),
        "_rms_norm_kernel[grid] only": raw_rms,
        "rotary_triton": lambda: rotary_triton(pos, q, k, cos_sin),
        "write_kv_triton": lambda: write_kv_triton(k, v, kc, vc, slots),
        "silu_and_mul_triton": lambda: silu_and_mul_triton(gate_up),
        "paged_attention_extend_triton": lambda: paged_attention_extend_triton(
            q, kc, vc, tables, cu, lens, hd ** -0.5, max_query_len=seq),
    }
    result = {"gpu": torch.cuda.get_device_name(), "tokens": n,
              "host_us_per_call": {name: host_us(fn) for name, fn in ops.items()}}

    # the whole model forward on the same tokens, and the LM head on 256 rows
    loaded = random_model(cfg, dt, dev)
    model = loaded.model
    kv = KVCache(KVCacheSpec.for_model(cfg, 16, dt), num_blocks, 0, dev, "auto")
    meta = AttentionMetadata(slot_mapping=slots, block_tables=tables, seq_lens=lens,
                             cu_seqlens_q=cu, max_query_len=seq, max_seq_len=seq, backend="auto")
    ids = torch.randint(0, 1000, (n,), device=dev)
    with torch.inference_mode():
        result["model forward host ms"] = host_us(
            lambda: model(ids, pos, kv.layers, meta), calls=3) / 1e3
        # where the forward's host time goes: cProfile of one call, device kept busy
        torch.cuda.synchronize()
        torch.cuda._sleep(int(3e8))
        prof = cProfile.Profile()
        prof.enable()
        model(ids, pos, kv.layers, meta)
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        result["forward_cprofile"] = buf.getvalue()
    print(json.dumps({k: v for k, v in result.items() if k != "forward_cprofile"}, indent=1))
    print(result["forward_cprofile"])
    with open(os.path.join(args.out, "launch_overhead.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
