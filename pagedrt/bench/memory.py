"""`pagedrt bench memory`: KV-cache bytes with paged blocks against contiguous allocation.

A contiguous engine reserves `max_model_len` token slots per sequence up front; a paged one
holds ceil(tokens / block_size) blocks per sequence, and with prefix caching and fork
(copy-on-write) sequences share the blocks of a common prefix. The paged numbers are not a
formula: each scenario is driven through the real `KVCacheManager` (admission with prefix-cache
lookups, token-by-token decode, fork for n > 1 with copy-on-write of the shared partial block)
and the blocks in use are counted when every sequence has reached its final length. Bytes are
then blocks x bytes per block of a model shape (2 * layers * block_size * kv_heads * head_dim *
dtype bytes); the block counts do not depend on the shape.

No model runs and nothing is timed: this is bookkeeping, and it runs on a CPU in a second.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import torch

from pagedrt.bench.presets import PRESETS
from pagedrt.core.request import Request
from pagedrt.entrypoints.arg_parser import ArgumentParser
from pagedrt.kv.kv_cache import kv_bytes_per_block
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.sampling_params import SamplingParams

# (prompt tokens, generated tokens) of sequences 1..8; the first k run in the k-sequence row
SEQUENCE_LENGTHS = [(512, 256), (1500, 500), (100, 200), (3000, 1000),
                    (64, 64), (700, 300), (2000, 48), (250, 750)]
SYSTEM_PROMPT_TOKENS = 1024  # shared by 8 requests
USER_TOKENS, SHARED_OUTPUT_TOKENS = 128, 256  # each of those 8 requests' own prompt and output
N_SAMPLES_PROMPT, N_SAMPLES_OUTPUT = 1000, 256  # n = 8 samples of one prompt (partial block)
SHAPES = ("smollm2-135m", "qwen2-0.5b", "llama3-8b")


@dataclass
class Usage:
    num_blocks: int  # blocks in use when every sequence has its final length
    num_tokens: int  # tokens summed over sequences (shared ones counted once per sequence)
    fragmentation_slots: int  # allocated slots minus distinct used slots


def _tokens(seed: int, n: int) -> list[int]:
    """n token ids unique to `seed` (no accidental sharing between sequences)."""
    return [seed * 100_000 + i for i in range(n)]


def simulate(sequences: list[tuple[list[int], int]], block_size: int, caching: bool,
             fork_n: int = 1) -> Usage:
    """Admit each (prompt, num_output) in turn, with its prefix-cache hits, then decode all of
    them token by token. With fork_n > 1 there is one prompt, forked into fork_n samples after
    its prefill (they share its blocks; the first write into the partial block copies it)."""
    total = sum(len(p) + n for p, n in sequences) * fork_n
    kv = KVCacheManager(num_blocks=2 * (total // block_size + len(sequences) * fork_n + 1),
                        block_size=block_size, enable_caching=caching)
    reqs = []
    for i, (prompt, num_output) in enumerate(sequences):
        req = Request(f"s{i}", prompt, SamplingParams(max_tokens=num_output))
        hits, num_hit_tokens = kv.get_computed_blocks(req)
        assert kv.allocate_slots(req, req.num_tokens - num_hit_tokens, hits) is not None
        req.num_computed_tokens = req.num_tokens
        reqs.append(req)
        for k in range(1, fork_n):
            child = Request(f"s{i}#{k}", prompt, req.params)
            kv.fork(req, child)
            child.num_computed_tokens = req.num_computed_tokens
            reqs.append(child)
    for step in range(max(n for _, n in sequences)):
        for j, req in enumerate(reqs):
            if req.num_output_tokens < req.params.max_tokens:
                req.output_token_ids.append(_tokens(1000 + j, step + 1)[-1])
                assert kv.allocate_slots(req, 1) is not None
                req.num_computed_tokens += 1
        kv.take_pending_copies()
    kv.check_integrity()
    usage = kv.usage(reqs)
    return Usage(usage["num_used_blocks"], sum(r.num_tokens for r in reqs),
                 usage["internal_fragmentation_slots"])


def _row(scenario: str, lengths: str, num_seqs: int, max_model_len: int, alone: Usage,
         shared: Usage | None) -> dict:
    return {"scenario": scenario, "lengths": lengths, "num_seqs": num_seqs,
            "num_tokens": alone.num_tokens, "contiguous_slots": num_seqs * max_model_len,
            "paged_blocks": alone.num_blocks,
            "shared_blocks": None if shared is None else shared.num_blocks,
            "fragmentation_slots": (shared or alone).fragmentation_slots}


def scenarios(block_size: int, max_model_len: int) -> list[dict]:
    """Every row of the table, in blocks and tokens (shape-independent)."""
    rows = []
    for k in (1, 2, 4, 8):
        seqs = [(_tokens(i, p), n) for i, (p, n) in enumerate(SEQUENCE_LENGTHS[:k])]
        lengths = ", ".join(f"{p}+{n}" for p, n in SEQUENCE_LENGTHS[:k])
        rows.append(_row(f"{k} sequence{'s' if k > 1 else ''}", lengths, k, max_model_len,
                         simulate(seqs, block_size, caching=False), None))
    system = _tokens(99, SYSTEM_PROMPT_TOKENS)
    seqs = [(system + _tokens(i, USER_TOKENS), SHARED_OUTPUT_TOKENS) for i in range(8)]
    rows.append(_row(
        "8 requests, shared system prompt",
        f"{SYSTEM_PROMPT_TOKENS} shared + {USER_TOKENS} own + {SHARED_OUTPUT_TOKENS} out",
        8, max_model_len, simulate(seqs, block_size, caching=False),
        simulate(seqs, block_size, caching=True)))
    prompt = _tokens(98, N_SAMPLES_PROMPT)
    alone = simulate([(prompt, N_SAMPLES_OUTPUT)] * 8, block_size, caching=False)
    forked = simulate([(prompt, N_SAMPLES_OUTPUT)], block_size, caching=True, fork_n=8)
    assert forked.num_tokens == alone.num_tokens, (forked, alone)
    rows.append(_row("n = 8 samples of one prompt",
                     f"{N_SAMPLES_PROMPT} shared + {N_SAMPLES_OUTPUT} out each",
                     8, max_model_len, alone, forked))
    return rows


def with_bytes(rows: list[dict], block_size: int, dtype: torch.dtype) -> dict[str, list[dict]]:
    """The rows in bytes for every model shape."""
    out = {}
    for name in SHAPES:
        per_block = kv_bytes_per_block(PRESETS[name], block_size, dtype)
        per_token = per_block // block_size
        out[name] = [dict(row, bytes_per_token=per_token,
                          contiguous_bytes=row["contiguous_slots"] * per_token,
                          paged_bytes=row["paged_blocks"] * per_block,
                          shared_bytes=None if row["shared_blocks"] is None
                          else row["shared_blocks"] * per_block) for row in rows]
    return out


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f}"


def markdown_table(rows: list[dict], block_size: int) -> str:
    lines = [
        ("| scenario | lengths (prompt+output) | tokens | contiguous MiB | paged MiB | "
         "paged + sharing MiB | best / contiguous | fragmentation (slots, % of allocated) |"),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        best_blocks = r["shared_blocks"] if r["shared_blocks"] is not None else r["paged_blocks"]
        best = r["shared_bytes"] if r["shared_bytes"] is not None else r["paged_bytes"]
        frag_pct = 100 * r["fragmentation_slots"] / (best_blocks * block_size)
        lines.append(
            f"| {r['scenario']} | {r['lengths']} | {r['num_tokens']:,} | "
            f"{_mib(r['contiguous_bytes'])} | {_mib(r['paged_bytes'])} | "
            f"{_mib(r['shared_bytes'])} | {100 * best / r['contiguous_bytes']:.1f} % | "
            f"{r['fragmentation_slots']} ({frag_pct:.2f} %) |")
    return "\n".join(lines)


def plot(rows: list[dict], shape: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["scenario"].replace(", ", ",\n") for r in rows]
    x = range(len(rows))
    width = 0.27
    fig, ax = plt.subplots(figsize=(11, 5))
    series = [("contiguous at max_model_len", "contiguous_bytes"), ("paged", "paged_bytes"),
              ("paged + prefix sharing / fork", "shared_bytes")]
    for k, (label, key) in enumerate(series):
        values = [(r[key] or 0) / 2**20 for r in rows]
        bars = ax.bar([i + (k - 1) * width for i in x], values, width, label=label)
        ax.bar_label(bars, [f"{v:.0f}" if v else "" for v in values], fontsize=7)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("KV cache MiB")
    ax.set_title(f"KV memory: paged blocks vs contiguous allocation ({shape} shape)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def update_benchmarks_md(path: str, section: str) -> None:
    """Replace the "## KV memory efficiency" section of `path` (or append it), leaving every
    other section as it is."""
    title = "## KV memory efficiency"
    text = "# Benchmarks\n"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    start = text.find(title + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(title))
        text = text[:start] + section + ("" if end < 0 else text[end + 1:])
    with open(path, "w") as f:
        f.write(text.rstrip("\n") + "\n")


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="pagedrt bench memory", description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="smollm2-135m", choices=SHAPES,
                   help="model shape of the printed table (the JSON has all of them)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096,
                   help="slots a contiguous engine reserves per sequence")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--out", default="benchmarks/results", help="folder for memory.json / .png")
    p.add_argument("--benchmarks-md", default=None,
                   help="also write the '## KV memory efficiency' section of this file")
    args = p.parse_args(argv)
    longest = max(p + n for p, n in SEQUENCE_LENGTHS)
    if args.max_model_len < longest:
        raise ValueError(f"--max-model-len={args.max_model_len} is shorter than the longest "
                         f"sequence of the table ({longest} tokens)")
    dtype = getattr(torch, args.dtype)
    rows = scenarios(args.block_size, args.max_model_len)
    by_shape = with_bytes(rows, args.block_size, dtype)
    table = markdown_table(by_shape[args.shape], args.block_size)
    command = "pagedrt bench memory " + " ".join(argv)
    meta = {"date": datetime.date.today().isoformat(), "machine": "CPU (bookkeeping, not timed)",
            "commit": _git_commit(), "command": command.strip(), "block_size": args.block_size,
            "max_model_len": args.max_model_len, "dtype": args.dtype}
    print(f"KV memory, {args.shape} shape, {args.dtype}, block_size {args.block_size}, "
          f"contiguous = max_model_len {args.max_model_len} slots per sequence\n")
    print(table)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "memory.json")
    with open(json_path, "w") as f:
        json.dump({**meta, "shapes": by_shape}, f, indent=2)
    png_path = os.path.join(args.out, "memory.png")
    plot(by_shape[args.shape], args.shape, png_path)
    print(f"\nwrote {json_path} and {png_path}")
    if args.benchmarks_md:
        update_benchmarks_md(args.benchmarks_md, _section(meta, by_shape, args, table))
        print(f"updated the KV memory efficiency section of {args.benchmarks_md}")
    return 0


def _section(meta: dict, by_shape: dict, args, table: str) -> str:
    other = []
    for name in SHAPES:
        r = by_shape[name]
        other.append(f"| {name} | {r[0]['bytes_per_token']:,} | "
                     + " | ".join(f"{_mib(x['contiguous_bytes'])} / "
                                  f"{_mib(x['shared_bytes'] or x['paged_bytes'])}" for x in r)
                     + " |")
    header = " | ".join(r["scenario"] for r in by_shape[args.shape])
    return f"""## KV memory efficiency

- **Date**: {meta['date']}. **Machine**: CPU; this is bookkeeping (block counts through the
  real `KVCacheManager`), nothing is timed. **Commit**: `{meta['commit']}` plus the working tree.
- **Command**: `{meta['command']}`
- **Setup**: block_size {args.block_size}, {args.dtype} KV, contiguous allocation reserves
  max_model_len = {args.max_model_len} slots per sequence. Paged = blocks in use when every
  sequence has reached its final length (admission with prefix-cache lookups, token-by-token
  decode; n = 8 by fork with copy-on-write of the shared partial block). "paged + sharing":
  prefix caching on (shared system prompt) or fork (n = 8). Results:
  `benchmarks/results/memory.json`, plot `benchmarks/results/memory.png`.

{args.shape} shape ({by_shape[args.shape][0]['bytes_per_token']:,} KV bytes per token):

{table}

Other shapes (KV bytes per token; MiB contiguous / best paged per scenario):

| shape | bytes/token | {header} |
|---|---:|{'---:|' * len(by_shape[args.shape])}
{chr(10).join(other)}

Paged blocks waste at most block_size - 1 slots per sequence (fragmentation column) against a
contiguous engine that reserves max_model_len for each; sharing cuts the shared system prompt
to one copy and the n = 8 prompt to one copy plus one copied partial block per sample.
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
