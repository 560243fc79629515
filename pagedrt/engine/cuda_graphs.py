"""CUDA graphs for decode-only steps.

A decode step launches a few hundred small kernels; replaying them as one CUDA graph removes
the per-launch CPU cost, which dominates at small batch sizes. One graph is captured per
bucket batch size (1, 2, 4, 8, then steps of 16 up to max_num_seqs); a batch of b sequences
replays the smallest bucket >= b with rows b.. padded (slot -1: nothing written; seq_len 1).

All graphs share static input buffers and one memory pool. The attention kernels compute their
split-K partitions from seq_lens on the device and take the block-table width as the bound,
so one capture serves every context length up to max_model_len.

Speculative decoding adds verification graphs: every sequence has the same query length
q = k + 1 (its last token and k drafts; a sequence with fewer drafts is padded with tokens
whose slot is -1, so their K/V are not written, and whose logits are not read), captured for
the buckets up to the batch where speculation switches off. Their attention runs each of the
b * q query tokens as a decode row of its own (the decode kernel, with the sequence's
block-table row repeated q times and seq_len = the token's position + 1): once the layer has
written the chunk's K/V, that is causal attention within the chunk, split over the context
like a decode step. The extend kernel (cu_seqlens_q = 0, q, 2q, ...; one program per KV head
and sequence streaming the whole context) left most of the GPU idle at batch 1 (see
docs/design.md, "Speculative decoding"); PAGEDRT_VERIFY_ATTENTION=extend captures it instead.

Decode graphs (q = 1) start with a kernel that scatters the step's staged inputs (one device
buffer, `staged`, filled by the step's one host-to-device copy) into the static buffers, and
reads the input ids still being sampled from `last_tokens` (pagedrt/ops/graph_inputs_triton.py;
docs/design.md, "Decode inputs staged for the graphs"): a decode step is then that copy and
the replay. On by default where Triton runs (measured on an H100: batch-1 0.88 -> 0.70 ms per
token; BENCHMARKS.md, "On an H100: staged graph inputs and seeded sampling");
PAGEDRT_STAGED_GRAPH_INPUTS=0 captures the graphs without the kernel, and a replay then copies
each input into its static buffer (`run`).
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from pagedrt.engine import step_timing
from pagedrt.env_flags import env_choice, env_flag
from pagedrt.ops.attention import AttentionMetadata, triton_available

logger = logging.getLogger("pagedrt.cuda_graphs")


def staged_inputs_enabled() -> bool:
    """Whether decode graphs take staged inputs: where Triton runs, unless
    PAGEDRT_STAGED_GRAPH_INPUTS=0 (docs/design.md, "Decode inputs staged for the graphs")."""
    return env_flag("PAGEDRT_STAGED_GRAPH_INPUTS") and triton_available()


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 48, ... up to max_num_seqs (included)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 16))
    return sorted(set(sizes + [max_num_seqs]))


class CUDAGraphRunner:
    def __init__(self, model, kv_layers, max_num_seqs: int, max_blocks_per_seq: int,
                 device: torch.device, backend: str, verify_query_len: int = 0,
                 verify_max_num_seqs: int = 0, block_size: int = 1,
                 capture_graphs: bool = True, last_tokens_size: int = 0) -> None:
        """verify_query_len: q = k + 1 of the verification graphs (0: none), captured for the
        buckets up to the first one >= verify_max_num_seqs. block_size: tokens per KV block
        (sets the context of the in-step timing's steps, `_time_in_step`).
        capture_graphs: False runs each "replay" eagerly on the static buffers (the tests'
        way to run the staged inputs on the CPU). last_tokens_size: rows of `last_tokens`
        (default 2 x max_num_seqs; a previous step that sampled more is read through
        `staged` instead, see ModelRunner.prepare)."""
        self.model = model
        self.kv_layers = kv_layers
        self.batch_sizes = graph_batch_sizes(max_num_seqs)
        self.max_bs = self.batch_sizes[-1]
        self.device = device
        self.backend = backend
        self.verify_query_len = verify_query_len
        self.verify_batch_sizes: list[int] = []
        if verify_query_len > 1 and verify_max_num_seqs > 0:
            top = next((b for b in self.batch_sizes if b >= verify_max_num_seqs), self.max_bs)
            self.verify_batch_sizes = [b for b in self.batch_sizes if b <= top]
        n = self.max_bs
        num_tokens = max(n, max(self.verify_batch_sizes, default=0) * verify_query_len)
        self.input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(num_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((num_tokens,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.cu_seqlens_q = {1: torch.arange(n + 1, dtype=torch.int32, device=device)}
        self.verify_as_decode = env_choice("PAGEDRT_VERIFY_ATTENTION") == "decode"
        self.capture_graphs = capture_graphs
        self.staged_inputs = staged_inputs_enabled()
        if self.staged_inputs:
            from pagedrt.ops.graph_inputs import staged_size

            # (fixed addresses: the decode graphs read them at every replay)
            self.staged = torch.zeros(staged_size(n, max_blocks_per_seq), dtype=torch.int64,
                                      device=device)
            self.last_tokens = torch.zeros(max(last_tokens_size or 2 * n, 1),
                                           dtype=torch.int64, device=device)
        if self.verify_batch_sizes:
            self.cu_seqlens_q[verify_query_len] = self.cu_seqlens_q[1] * verify_query_len
        # (query length, bucket) -> graph, logits
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        self.pool = None
        self.block_size = block_size

    def _meta(self, bs: int, q: int) -> AttentionMetadata:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[: bs * q], block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs], cu_seqlens_q=self.cu_seqlens_q[q][: bs + 1],
            max_query_len=q, max_seq_len=self.block_tables.shape[1], backend=self.backend,
        )
        # (captured: recomputed at every replay, once before the layers, not per layer)
        if q > 1 and self.verify_as_decode:
            meta.query_block_tables = meta.block_tables.repeat_interleave(q, dim=0)
            meta.query_seq_lens = (self.positions[: bs * q] + 1).to(torch.int32)
        return meta

    def _scatter(self, bs: int) -> None:
        """The staged step into the first bs rows of the static buffers (in the graph)."""
        if self.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            from pagedrt.ops.graph_inputs_triton import scatter_decode_inputs
        else:
            from pagedrt.ops.graph_inputs import (
                scatter_decode_inputs_reference as scatter_decode_inputs,
            )
        scatter_decode_inputs(self.staged, self.last_tokens, self.input_ids, self.positions,
                              self.slot_mapping, self.seq_lens, self.block_tables, bs)

    def advance_staged(self, n: int, width: int, tokens: torch.Tensor) -> None:
        """Move the n-row step in `staged` (width table entries a row) on to a multi-step
        decode's next pass, its input ids those in `last_tokens`, which are also copied to
        `tokens` ([n] int64): one launch (pagedrt/ops/graph_inputs.py)."""
        if self.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            from pagedrt.ops.graph_inputs_triton import advance_decode_inputs
        else:
            from pagedrt.ops.graph_inputs import (
                advance_decode_inputs_reference as advance_decode_inputs,
            )
        advance_decode_inputs(self.staged, n, width, self.block_size, self.last_tokens, tokens)

    def _forward(self, bs: int, q: int) -> torch.Tensor:
        hidden = self.model(self.input_ids[: bs * q], self.positions[: bs * q], self.kv_layers,
                            self._meta(bs, q))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per bucket, largest first (later ones reuse its memory pool):
        the decode graphs, then the verification graphs."""
        timing = contextlib.nullcontext
        if triton_available():  # (optional: the torch backend runs graphs without it)
            from pagedrt.ops.matmul_triton import timing
        with timing():  # the decode matmul picks its tiles per shape here (matmul_triton.py)
            self._capture()

    def _capture(self) -> None:
        shapes = [(1, bs) for bs in reversed(self.batch_sizes)]
        shapes += [(self.verify_query_len, bs) for bs in reversed(self.verify_batch_sizes)]
        for q in {q for q, _ in shapes}:  # compile and autotune the kernels outside capture
            self.seq_lens.fill_(q)  # a sequence's q tokens end at its seq_len
            self._forward(max(bs for qq, bs in shapes if qq == q), q)
        torch.cuda.synchronize(self.device)
        if step_timing.BUCKETS and self.pool is None:
            # the in-step timing may capture before the first kept graph: into the same pool
            self.pool = torch.cuda.graph_pool_handle()
        for q, bs in shapes:
            graph = torch.cuda.CUDAGraph()
            self.seq_lens.fill_(q)  # (outside the capture: a replay must not reset it)
            self._forward(bs, q)  # warm-up on the capture's shapes (times their ops)
            if q == 1 and bs in step_timing.BUCKETS:
                self._time_in_step(bs)  # (leaves seq_lens at 1)
            staged = q == 1 and self.staged_inputs
            if staged:
                self.staged[:2] = 0  # (n = 0: every row padding, for the kernel's compile)
                self._scatter(bs)
                self.seq_lens.fill_(q)
            with torch.cuda.graph(graph, pool=self.pool):
                if staged:
                    self._scatter(bs)
                self.logits[q, bs] = self._forward(bs, q)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[q, bs] = graph
        self.seq_lens.fill_(1)
        torch.cuda.synchronize(self.device)

    def _time_in_step(self, bs: int) -> None:
        """Revisit the `bs`-row ops' tile choices by timing whole decode graphs
        (pagedrt/engine/step_timing.py); skipped under tensor parallelism."""
        if (torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1):
            logger.info("in-step timing skipped at batch %d: tensor parallelism", bs)
            return
        if not triton_available():
            return
        from pagedrt.ops.config_timing import recording_use, step_candidates

        candidates = step_candidates(bs, step_timing.MARGIN, step_timing.LIMIT)
        if not candidates:
            return
        self.seq_lens[:bs].fill_(min(step_timing.CONTEXT,
                                     self.block_tables.shape[1] * self.block_size))

        def capture():
            graph = torch.cuda.CUDAGraph()
            self._forward(bs, 1)  # (outside the capture, as for the kept graphs)
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self._forward(bs, 1)
            return graph, logits  # its output stays allocated while the graph may replay

        def time_graph(captured) -> float:
            graph = captured[0]
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(step_timing.REPLAYS):
                graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / step_timing.REPLAYS

        def used() -> set:
            with recording_use() as keys:
                self._forward(bs, 1)
            return keys

        step_timing.refine(candidates, capture, time_graph, used=used)
        self.seq_lens.fill_(1)
        torch.cuda.synchronize(self.device)

    def can_run(self, num_seqs: int, width: int, query_len: int = 1) -> bool:
        """Whether a captured graph serves num_seqs sequences of query_len tokens each whose
        block tables are `width` wide."""
        if width > self.block_tables.shape[1]:
            return False
        if query_len == 1:
            return ((1, self.max_bs) in self.graphs or not self.capture_graphs
                    ) and num_seqs <= self.max_bs
        return (query_len == self.verify_query_len and bool(self.verify_batch_sizes)
                and num_seqs <= self.verify_batch_sizes[-1])

    @torch.inference_mode()
    def run(self, input_ids, positions, slot_mapping, seq_lens, block_tables,
            query_len: int = 1) -> torch.Tensor:
        """Replay for b sequences of `query_len` tokens each (host or device tensors:
        b * query_len tokens, b seq_lens and block-table rows); returns
        [b * query_len, vocab]."""
        b = seq_lens.shape[0]
        q = query_len
        assert q > 1 or not self.staged_inputs, "decode graphs take staged inputs: replay_staged"
        sizes = self.batch_sizes if q == 1 else self.verify_batch_sizes
        bs = next(s for s in sizes if s >= b)
        self.input_ids[: b * q].copy_(input_ids, non_blocking=True)
        self.positions[: b * q].copy_(positions, non_blocking=True)
        self.slot_mapping[: b * q].copy_(slot_mapping, non_blocking=True)
        self.seq_lens[:b].copy_(seq_lens, non_blocking=True)
        if b < bs:
            self.slot_mapping[b * q: bs * q].fill_(-1)
            self.positions[b * q: bs * q].fill_(0)  # (a padded query token reads 1 slot)
            self.seq_lens[b:bs].fill_(q)
        self.block_tables[:b, : block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        if not self.capture_graphs:
            return self._forward(bs, q)[: b * q]
        self.graphs[q, bs].replay()
        return self.logits[q, bs][: b * q]

    @torch.inference_mode()
    def replay_staged(self, num_seqs: int) -> torch.Tensor:
        """Replay the decode graph for num_seqs rows whose inputs are in `staged` (copied
        there, and input ids pending from the previous step's samples in `last_tokens`, before
        this call on the same stream); returns [num_seqs, vocab]."""
        bs = next(s for s in self.batch_sizes if s >= num_seqs)
        if not self.capture_graphs:
            self._scatter(bs)
            return self._forward(bs, 1)[:num_seqs]
        self.graphs[1, bs].replay()
        return self.logits[1, bs][:num_seqs]
