"""CUDA graphs for decode-only steps.

A decode step launches a few hundred small kernels; replaying them as one CUDA graph removes
the per-launch CPU cost, which dominates at small batch sizes. One graph is captured per
bucket batch size (1, 2, 4, 8, then steps of 16 up to max_num_seqs); a batch of b sequences
replays the smallest bucket >= b with rows b.. padded (slot -1: nothing written; seq_len 1).

All graphs share static input buffers and one memory pool. The attention kernels compute their
split-K partitions from seq_lens on the device and take the block-table width as the bound,
so one capture serves every context length up to max_model_len.
"""

from __future__ import annotations

import torch

from pagedrt.ops.attention import AttentionMetadata


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 48, ... up to max_num_seqs (included)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 16))
    return sorted(set(sizes + [max_num_seqs]))


class CUDAGraphRunner:
    def __init__(self, model, kv_layers, max_num_seqs: int, max_blocks_per_seq: int,
                 device: torch.device, backend: str) -> None:
        self.model = model
        self.kv_layers = kv_layers
        self.batch_sizes = graph_batch_sizes(max_num_seqs)
        self.max_bs = self.batch_sizes[-1]
        self.device = device
        self.backend = backend
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool = None

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs], cu_seqlens_q=self.cu_seqlens_q[: bs + 1],
            max_query_len=1, max_seq_len=self.block_tables.shape[1], backend=self.backend,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        hidden = self.model(self.input_ids[:bs], self.positions[:bs], self.kv_layers,
                            self._meta(bs))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per bucket, largest first (later ones reuse its memory pool)."""
        self._forward(self.max_bs)  # compile and autotune the kernels outside capture
        torch.cuda.synchronize(self.device)
        for bs in reversed(self.batch_sizes):
            graph = torch.cuda.CUDAGraph()
            self._forward(bs)  # warm-up on the capture's shapes
            with torch.cuda.graph(graph, pool=self.pool):
                self.logits[bs] = self._forward(bs)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)

    def can_run(self, num_seqs: int, width: int) -> bool:
        return bool(self.graphs) and num_seqs <= self.max_bs and width <= self.block_tables.shape[1]

    @torch.inference_mode()
    def run(self, input_ids, positions, slot_mapping, seq_lens, block_tables) -> torch.Tensor:
        """Replay for a decode batch (host or device tensors of b rows); returns [b, vocab]."""
        b = input_ids.shape[0]
        bs = next(s for s in self.batch_sizes if s >= b)
        self.input_ids[:b].copy_(input_ids, non_blocking=True)
        self.positions[:b].copy_(positions, non_blocking=True)
        self.slot_mapping[:b].copy_(slot_mapping, non_blocking=True)
        self.seq_lens[:b].copy_(seq_lens, non_blocking=True)
        if b < bs:
            self.slot_mapping[b:bs].fill_(-1)
            self.seq_lens[b:bs].fill_(1)
        self.block_tables[:b, : block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        self.graphs[bs].replay()
        return self.logits[bs][:b]
