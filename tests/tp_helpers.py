"""Helpers for the tensor-parallel tests that run inside worker processes (through
`Executor.collective_rpc`, which pickles them by name: they live in an importable module, not in
a test file), for writing a model to a Hugging Face folder, and for the torchrun tests' processes
(a free port, a process tree from /proc, signals)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket

import torch
from safetensors.torch import save_file


@torch.inference_mode()
def greedy_logits(worker, prompts: list[list[int]], num_steps: int,
                  forced: list[list[int]] | None = None) -> list[torch.Tensor]:
    """On one rank: prefill `prompts` packed in one step, then decode them together
    `num_steps` times on a scratch KV cache of this rank's heads (the engine's cache is left
    alone). Each decode feeds `forced[i][step]` when given (teacher forcing), else the greedy
    token. Returns per prompt the fp32 CPU logits [len(prompt) + num_steps, vocab_size]: every
    prefill position, then each decode step."""
    from pagedrt.kv.kv_cache import KVCache
    from pagedrt.ops.attention import AttentionMetadata

    model, spec, device = worker.model, worker.kv_spec, worker.device
    bs = spec.block_size
    num_blocks = [-(-(len(p) + num_steps) // bs) for p in prompts]
    cache = KVCache(spec, sum(num_blocks), 0, device, "torch")
    tables, first = [], 0
    for n in num_blocks:
        tables.append(list(range(first, first + n)))
        first += n
    width = max(num_blocks)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                dtype=torch.int32, device=device)
    seq_lens = [0] * len(prompts)

    def run(new_tokens: list[list[int]]) -> tuple[torch.Tensor, ...]:
        positions, slots, cu = [], [], [0]
        for i, tokens in enumerate(new_tokens):
            for pos in range(seq_lens[i], seq_lens[i] + len(tokens)):
                positions.append(pos)
                slots.append(tables[i][pos // bs] * bs + pos % bs)
            seq_lens[i] += len(tokens)
            cu.append(cu[-1] + len(tokens))
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=device),
            block_tables=block_tables,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            max_query_len=max(map(len, new_tokens)), max_seq_len=max(seq_lens),
            backend="torch")
        ids = torch.tensor([t for tokens in new_tokens for t in tokens], device=device)
        hidden = model(ids, torch.tensor(positions, device=device), cache.layers, meta)
        return model.compute_logits(hidden).float().cpu().split(list(map(len, new_tokens)))

    out = [[part] for part in run(prompts)]
    for step in range(num_steps):
        nxt = [forced[i][step] if forced else int(out[i][-1][-1].argmax())
               for i in range(len(prompts))]
        for i, part in enumerate(run([[t] for t in nxt])):
            out[i].append(part)
    return [torch.cat(parts) for parts in out]


def raise_on_rank(worker, rank: int) -> int:
    """Raise on rank `rank`, answer the rank elsewhere (a worker that raises)."""
    if worker.rank == rank:
        raise RuntimeError(f"injected failure on rank {rank}")
    return worker.rank


def save_hf_folder(loaded, folder: str, tokenizer_dir: str | None = None) -> str:
    """Write a LoadedModel as a Hugging Face folder (config.json, model.safetensors, and the
    tokenizer files of `tokenizer_dir`) that `load_model` reads back to the same weights."""
    mc = loaded.model_config
    os.makedirs(folder, exist_ok=True)
    tensors = {k: v.detach().clone().contiguous() for k, v in loaded.model.hf_state_dict().items()
               if not (k == "lm_head.weight" and mc.tie_word_embeddings)}
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    fields = dataclasses.asdict(mc)
    cfg = {"architectures": [fields.pop("architecture")],
           "eos_token_id": list(fields.pop("eos_token_ids")) or None, **fields}
    for name in ("qk_norm", "rope_scaling"):
        cfg.pop(name)
    for name in ("sliding_window", "layer_types", "rope_local_theta", "query_pre_attn_scalar"):
        if not cfg[name]:  # unset (transformers refuses an empty layer_types)
            cfg.pop(name)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    if tokenizer_dir is not None:
        for name in os.listdir(tokenizer_dir):
            shutil.copy(os.path.join(tokenizer_dir, name), folder)
    return folder


def count_graph_replays(worker) -> list[int]:
    """Make the rank count its CUDA-graph replays (read with `graph_replays`), through either
    entry of the graph runner (`run`, and `replay_staged`, the decode steps' path with staged
    inputs, the default); returns the batch sizes it captured decode graphs for (query length
    1), ascending ([] with graphs off)."""
    runner = worker.model_runner.graph_runner
    if runner is None:
        return []
    worker.graph_replays = 0

    def counting(replay):
        def counted(*args, **kwargs):
            worker.graph_replays += 1
            return replay(*args, **kwargs)
        return counted

    runner.run = counting(runner.run)
    runner.replay_staged = counting(runner.replay_staged)
    return sorted(bs for q, bs in runner.graphs if q == 1)


def graph_replays(worker) -> int:
    return worker.graph_replays


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, parents first (from /proc). torchrun starts its
    workers in sessions of their own, so signalling the agent's process group misses them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def signal_all(pids: list[int], sig: int) -> None:
    """Send `sig` to each of `pids` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
