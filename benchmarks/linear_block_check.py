"""Does F.linear block the host while the GPU is busy? For each shape, queue ~50 ms of GPU
work (torch.cuda._sleep), then time the host side of one F.linear call: a call that waits for
the device takes ~50 ms, one that only launches takes microseconds. A diagnostic.

    python3 benchmarks/linear_block_check.py
"""
import time

import torch
import torch.nn.functional as F

dev = "cuda"
dt = torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
weights = {  # Qwen2-0.5B projections: (out, in, bias)
    "qkv": (1152, 896, True), "o": (896, 896, False), "gate_up": (9728, 896, False),
    "down": (896, 4864, False), "lm_head": (151936, 896, False)}
W = {k: (torch.randn(n, i, device=dev, dtype=dt, generator=g) * 0.02,
         torch.zeros(n, device=dev, dtype=dt) if b else None) for k, (n, i, b) in weights.items()}
torch.cuda.synchronize()
cycles = int(1e8)  # about 50 ms at 1.98 GHz
rows = []
for rep in range(3):
    for m in (1143, 16384, 1024, 1144, 1141, 999, 256, 255, 300, 2049):
        for name, (w, b) in W.items():
            if name == "lm_head" and m > 2049:
                continue
            x = torch.randn(m, w.shape[1], device=dev, dtype=dt, generator=g)
            torch.cuda.synchronize()
            torch.cuda._sleep(cycles)
            t = time.perf_counter()
            F.linear(x, w, b)
            host_ms = 1e3 * (time.perf_counter() - t)
            torch.cuda.synchronize()
            rows.append((rep, m, name, host_ms))
            if host_ms > 5:
                print(f"BLOCKED rep {rep} M={m} {name}: {host_ms:.1f} ms on the host")
print("calls:", len(rows), "blocked (>5 ms):", sum(r[3] > 5 for r in rows))
print("max host ms per rep:", [round(max(r[3] for r in rows if r[0] == k), 3) for k in range(3)])
