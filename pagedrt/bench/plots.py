"""PNG plots for `pagedrt bench throughput` and `pagedrt bench serve` results (matplotlib, no
display needed)."""

from __future__ import annotations

import os


def plot_throughput(results: list[dict], out_dir: str, name: str) -> list[str]:
    """Writes `<name>_vs_batch.png` (output tok/s against the number of concurrent requests,
    pagedrt and HF generate) and `<name>_roofline.png` (measured time against the roofline
    floor). Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    ours = sorted((r["num_requests"], r["output_tok_s"]) for r in results
                  if r["system"] == "pagedrt" and "x" in r["workload"].split()[-1])
    hf = sorted((r["batch_size"], r["output_tok_s"]) for r in results
                if r["system"] == "hf-generate" and "output_tok_s" in r)
    fig, ax = plt.subplots(figsize=(6, 4))
    if ours:
        ax.plot(*zip(*ours), "o-", label="pagedrt (continuous batching)")
    if hf:
        ax.plot(*zip(*hf), "s--", label="HF generate (static batch)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent requests (batch size)")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{name}: throughput against batch size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    paths.append(os.path.join(out_dir, f"{name}_vs_batch.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    rows = [r for r in results if r["system"] == "pagedrt" and "roofline_floor_s" in r]
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [r["workload"] for r in rows]
        ax.bar(labels, [r["elapsed_s"] for r in rows], label="measured")
        ax.bar(labels, [r["roofline_floor_s"] for r in rows], label="roofline floor", alpha=0.8)
        for i, r in enumerate(rows):
            ax.text(i, r["elapsed_s"], f"{r['roofline_efficiency']:.0%}", ha="center",
                    va="bottom")
        ax.set_ylabel("seconds")
        ax.set_title("time against the floor (weights + KV read, prefill FLOPs)")
        ax.legend()
        paths.append(os.path.join(out_dir, f"{name}_roofline.png"))
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def plot_serve(results: list[dict], path: str, title: str = "") -> str:
    """Writes `path`: TTFT and TPOT (p50 and p99, ms) of `pagedrt bench serve` results against
    the offered request rate, one point per rate in sweep order ("inf" = all at once).
    A rate without the metric (not streamed, nothing completed) is left out. Returns path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["request_rate"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for q, style in (("median", "o-"), ("p99", "s--")):
            points = [(i, r[key][q]) for i, r in enumerate(results) if r[key][q] is not None]
            if points:
                ax.plot(*zip(*points), style, label=f"{name} {'p50' if q == 'median' else q}")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title or "bench serve: latency against request rate")
    fig.tight_layout()
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
