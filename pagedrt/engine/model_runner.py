"""ModelRunner: turns a SchedulerOutput into model inputs, runs the model, returns logits.

Inputs of one step, for requests r_0..r_{n-1} with query lengths q_i (new tokens):

    input_ids, positions, slot_mapping   [sum q_i]      packed, request after request
    cu_seqlens_q                         [n + 1]        0, q_0, q_0+q_1, ...
    seq_lens                             [n]            num_computed_tokens_i + q_i
    block_tables                         [n, max_blocks] padded with 0

Logits are computed only for the last token of requests whose step completes their tokens
(decodes, and the last chunk of a prefill).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedrt.engine.cuda_graphs import CUDAGraphRunner
from pagedrt.engine.profiling import NULL_CLOCK
from pagedrt.engine.scheduler import SchedulerOutput
from pagedrt.kv.kv_cache import KVCache
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.ops.attention import AttentionMetadata


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64, rows of the hidden states to sample
    sampled_requests: list  # the requests those rows belong to


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, kv_manager: KVCacheManager, device, backend,
                 max_num_seqs: int = 256, max_model_len: int = 2048, use_cuda_graphs: bool = False):
        self.model = model
        self.kv_cache = kv_cache
        self.kv = kv_manager
        self.device = torch.device(device)
        self.backend = backend
        self.block_size = kv_manager.block_size
        self.graph_runner: CUDAGraphRunner | None = None
        if use_cuda_graphs and self.device.type == "cuda":
            self.graph_runner = CUDAGraphRunner(
                model, kv_cache.layers, max_num_seqs, kv_manager.blocks_for(max_model_len),
                self.device, backend)
            self.graph_runner.capture()

    def prepare(self, sched: SchedulerOutput) -> ModelInputs:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        seq_lens: list[int] = []
        cu_seqlens_q = [0]
        tables: list[list[int]] = []
        logits_indices: list[int] = []
        sampled = []
        for req, num_new in zip(sched.requests, sched.num_new_tokens):
            start = req.num_computed_tokens
            end = start + num_new
            block_ids = self.kv.block_ids(req.request_id)
            input_ids.extend(req.token_ids_slice(start, end))
            positions.extend(range(start, end))
            slot_mapping.extend(block_ids[p // bs] * bs + p % bs for p in range(start, end))
            seq_lens.append(end)
            cu_seqlens_q.append(cu_seqlens_q[-1] + num_new)
            tables.append(block_ids)
            if end == req.num_tokens:
                logits_indices.append(cu_seqlens_q[-1] - 1)
                sampled.append(req)
        width = max(len(t) for t in tables)
        block_tables = [t + [0] * (width - len(t)) for t in tables]
        dev = self.device
        pin = dev.type == "cuda"

        def tensor(x, dtype):
            t = torch.tensor(x, dtype=dtype)
            return t.pin_memory().to(dev, non_blocking=True) if pin else t

        meta = AttentionMetadata(
            slot_mapping=tensor(slot_mapping, torch.int64),
            block_tables=tensor(block_tables, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            cu_seqlens_q=tensor(cu_seqlens_q, torch.int32),
            max_query_len=max(sched.num_new_tokens),
            max_seq_len=max(seq_lens),
            backend=self.backend,
        )
        return ModelInputs(
            input_ids=tensor(input_ids, torch.int64),
            positions=tensor(positions, torch.int64),
            meta=meta,
            logits_indices=tensor(logits_indices, torch.int64),
            sampled_requests=sampled,
        )

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, clock=NULL_CLOCK) -> tuple[torch.Tensor, list]:
        """Apply pending block copies, run the model; returns (logits [num_sampled, vocab]
        float32, the sampled requests in row order)."""
        if sched.copies:
            self.kv_cache.apply(sched.copies)
        inputs = self.prepare(sched)
        clock.mark("prepare")
        meta = inputs.meta
        if (self.graph_runner is not None and meta.is_decode_only
                and self.graph_runner.can_run(len(sched.requests), meta.block_tables.shape[1])):
            logits = self.graph_runner.run(inputs.input_ids, inputs.positions, meta.slot_mapping,
                                           meta.seq_lens, meta.block_tables)
            logits = logits[inputs.logits_indices]
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, meta)
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
        clock.mark("forward")
        return logits, inputs.sampled_requests
