"""PNG plots for `pagedrt bench throughput` results (matplotlib, no display needed)."""

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
