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

import time
from dataclasses import dataclass

import numpy as np
import torch

from pagedrt.engine.cuda_graphs import CUDAGraphRunner
from pagedrt.engine.profiling import NULL_CLOCK
from pagedrt.engine.scheduler import SchedulerOutput
from pagedrt.kv.kv_cache import KVCache
from pagedrt.kv.kv_cache_manager import KVCacheManager
from pagedrt.ops.attention import AttentionMetadata

EAGER_TOKEN_PADDING = 64
"""On CUDA, a step that runs eagerly (not a CUDA-graph replay) is padded to a multiple of this
many tokens: the padding tokens have id 0, position 0 and slot -1 (their K/V are not written),
belong to no sequence in cu_seqlens_q, and no logits are read from their rows (every op on the
way is row-wise, so they touch no real row). Why: cuBLAS picks a GEMM kernel per shape, and the
first call of a kernel not yet used in the process loads it (CUDA lazy module loading), which
waits for the device. In an async pipeline a mixed step with a token count never seen before
then stalled the host for the whole step in flight (about 25 ms behind a 16k-token prefill on
the H200). Padded, the token counts are few enough to run every GEMM shape once at start-up
(`ModelRunner.warm_up_gemms`). The cost is at most 63 padding rows per eager step. Decode-only
steps are not padded: they replay graphs captured at padded batch sizes (with enforce_eager
they run unpadded, and a first-seen batch size can still wait once)."""


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor | None  # [num_sampled] int64, rows of the hidden states to
    # sample; None: every row, in order (a decode step)
    sampled_requests: list  # the requests those rows belong to


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, kv_manager: KVCacheManager, device, backend,
                 max_num_seqs: int = 256, max_model_len: int = 2048, use_cuda_graphs: bool = False,
                 max_num_batched_tokens: int = 8192):
        self.model = model
        self.kv_cache = kv_cache
        self.kv = kv_manager
        self.device = torch.device(device)
        self.backend = backend
        self.block_size = kv_manager.block_size
        self.graph_runner: CUDAGraphRunner | None = None
        # two pinned host buffers for the inputs, used in turn: with async scheduling the
        # copy out of one may still be queued while the next step's inputs are written
        # (allocated now: pinning memory later, cudaHostAlloc, would wait for the device and
        # stall the pipeline; they grow only for a step larger than these bounds)
        self._staging: list[torch.Tensor] = []
        self._num_prepared = 0
        # tokens of an eager step are padded to a multiple of this (1: no padding); tests set
        # it on CPU to check that padding changes no result
        self.token_padding = EAGER_TOKEN_PADDING if self.device.type == "cuda" else 1
        max_step_tokens = -(-max(max_num_batched_tokens, max_num_seqs) // self.token_padding
                            ) * self.token_padding
        if self.device.type == "cuda":
            size = (3 * max_step_tokens + 6 * (max_num_seqs + 1)
                    + max_num_seqs * kv_manager.blocks_for(max_model_len))
            self._staging = [torch.empty(size, dtype=torch.int64, pin_memory=True)
                             for _ in range(2)]
        self.gemm_warm_up_s = 0.0  # seconds spent in warm_up_gemms (at start-up on CUDA)
        if self.device.type == "cuda":
            self.warm_up_gemms(max_step_tokens, max_num_seqs)
        if use_cuda_graphs and self.device.type == "cuda":
            self.graph_runner = CUDAGraphRunner(
                model, kv_cache.layers, max_num_seqs, kv_manager.blocks_for(max_model_len),
                self.device, backend)
            self.graph_runner.capture()

    @torch.inference_mode()
    def warm_up_gemms(self, max_step_tokens: int, max_num_seqs: int) -> None:
        """Run every matmul shape a step with prompt tokens can take once, so that no kernel
        is loaded for the first time mid-run (see EAGER_TOKEN_PADDING): each linear layer's
        weight at every padded token count up to `max_step_tokens`, and the LM head at 1 to
        `max_num_seqs` rows (one per sampled request). Sets `gemm_warm_up_s`."""
        from pagedrt.models.layers import LinearBase

        start = time.perf_counter()
        shapes = {}
        for module in self.model.modules():
            if isinstance(module, LinearBase):
                w, b = module.weight, module.bias
                shapes.setdefault((tuple(w.shape), w.dtype, b is not None), (w, b))
        pad = self.token_padding
        inputs: dict[int, torch.Tensor] = {}
        for w, b in shapes.values():
            k = w.shape[1]
            if k not in inputs:
                inputs[k] = torch.zeros(max_step_tokens, k, dtype=w.dtype, device=self.device)
            for m in range(pad, max_step_tokens + 1, pad):
                torch.nn.functional.linear(inputs[k][:m], w, b)
        hidden_size = self.model.config.hidden_size
        h = torch.zeros(max_num_seqs, hidden_size, dtype=next(self.model.parameters()).dtype,
                        device=self.device)
        for m in range(1, max_num_seqs + 1):
            self.model.compute_logits(h[:m])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.gemm_warm_up_s = time.perf_counter() - start

    def prepare(self, sched: SchedulerOutput,
                prev_token_ids: torch.Tensor | None = None) -> ModelInputs:
        """Build the step's input tensors with numpy and move them in one host-to-device copy.

        prev_token_ids: [rows] int64 on the device, the tokens sampled by the step still in
        flight (async scheduling). A request whose last token is a placeholder takes its input
        id from row `request.pending_row` of it, on the device, without waiting for the host.
        """
        bs = self.block_size
        reqs = sched.requests
        n = len(reqs)
        q_lens = np.asarray(sched.num_new_tokens, dtype=np.int64)  # [n]
        starts = np.fromiter((r.num_computed_tokens for r in reqs), np.int64, n)  # [n]
        totals = np.fromiter((len(r.prompt_token_ids) + len(r.output_token_ids) for r in reqs),
                             np.int64, n)  # [n] num_tokens (spelled out: per request per step)
        ends = starts + q_lens
        cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(q_lens, out=cu[1:])
        num_tokens = int(cu[-1])
        block_tables = self.kv.block_tables([r.request_id for r in reqs])  # [n, width]
        width = block_tables.shape[1]
        if num_tokens == n:  # every request has one new token (decode)
            # token s of each request, without a call per request (a placeholder's -1 is
            # replaced on the device below)
            input_ids = np.fromiter(
                (r.prompt_token_ids[s] if s < len(r.prompt_token_ids)
                 else r.output_token_ids[s - len(r.prompt_token_ids)]
                 for r, s in zip(reqs, starts.tolist())), np.int64, n)
            positions = starts
            rows = np.arange(n)
        else:
            input_ids = np.concatenate([r.token_array(s, e) for r, s, e in
                                        zip(reqs, starts.tolist(), ends.tolist())])
            rows = np.repeat(np.arange(n), q_lens)  # request of each token
            positions = np.arange(num_tokens) - cu[rows] + starts[rows]
        slot_mapping = block_tables[rows, positions // bs] * bs + positions % bs
        num_padding = -num_tokens % self.token_padding
        if num_padding and num_tokens > n:
            # a step with prompt tokens runs eagerly: pad (see EAGER_TOKEN_PADDING); decode
            # steps are replays of graphs captured at padded batch sizes
            input_ids = np.concatenate([input_ids, np.zeros(num_padding, np.int64)])
            positions = np.concatenate([positions, np.zeros(num_padding, np.int64)])
            slot_mapping = np.concatenate([slot_mapping, np.full(num_padding, -1, np.int64)])
        is_sampled = ends == totals  # the step completes the request's known tokens
        sampled_idx = np.flatnonzero(is_sampled)
        logits_indices = cu[1:][sampled_idx] - 1
        # placeholders (always a request's last token): (token index, row in prev_token_ids)
        pending = np.flatnonzero(is_sampled & np.fromiter(
            (r.num_pending_tokens for r in reqs), np.bool_, n))
        pend_dst = cu[1:][pending] - 1
        pend_src = np.fromiter((reqs[i].pending_row for i in pending.tolist()), np.int64,
                               len(pending))
        # one staging buffer, one copy: the int64 parts, then the int32 ones packed two to an
        # int64 (viewed back as int32 on the device: no conversion kernels)
        #   [ids | positions | slots | logits | pending dst | pending src | cu, seq_lens, tables]
        small = np.concatenate([cu, ends, block_tables.ravel()]).astype(np.int32)
        if len(small) % 2:
            small = np.append(small, np.int32(0))
        parts = [input_ids, positions, slot_mapping, logits_indices, pend_dst, pend_src,
                 small.view(np.int64)]
        flat = torch.from_numpy(np.concatenate(parts))
        if self.device.type == "cuda":
            k = self._num_prepared % 2
            self._num_prepared += 1
            if self._staging[k].numel() < flat.numel():
                self._staging[k] = torch.empty(max(flat.numel(), 1 << 16), dtype=torch.int64,
                                               pin_memory=True)
            staged = self._staging[k][: flat.numel()]
            staged.copy_(flat)
            flat = staged.to(self.device, non_blocking=True)
        ids_t, pos_t, slot_t, logit_t, dst_t, src_t, small_t = torch.split(
            flat, [len(x) for x in parts])
        cu_t, lens_t, tables_t = torch.split(small_t.view(torch.int32)[: len(cu) + n + n * width],
                                             [n + 1, n, n * width])
        if len(pending):
            assert prev_token_ids is not None, "placeholder tokens but no step in flight"
            ids_t.index_copy_(0, dst_t, prev_token_ids.index_select(0, src_t))
        meta = AttentionMetadata(
            slot_mapping=slot_t,
            block_tables=tables_t.view(n, width),
            seq_lens=lens_t,
            cu_seqlens_q=cu_t,
            max_query_len=int(q_lens.max()),
            max_seq_len=int(ends.max()),
            backend=self.backend,
        )
        # a decode step samples every row in order: its logits need no gather
        all_rows = len(sampled_idx) == n == num_tokens
        return ModelInputs(
            input_ids=ids_t, positions=pos_t, meta=meta,
            logits_indices=None if all_rows else logit_t,
            sampled_requests=reqs if all_rows else [reqs[i] for i in sampled_idx.tolist()],
        )

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, clock=NULL_CLOCK,
                prev_token_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        """Apply pending block copies, run the model; returns (logits [num_sampled, vocab]
        in the model's dtype, the sampled requests in row order). prev_token_ids: see
        `prepare`."""
        if sched.copies:
            self.kv_cache.apply(sched.copies)
        inputs = self.prepare(sched, prev_token_ids)
        clock.mark("prepare")
        meta = inputs.meta
        if (self.graph_runner is not None and meta.is_decode_only
                and self.graph_runner.can_run(len(sched.requests), meta.block_tables.shape[1])):
            logits = self.graph_runner.run(inputs.input_ids, inputs.positions, meta.slot_mapping,
                                           meta.seq_lens, meta.block_tables)
            if inputs.logits_indices is not None:
                logits = logits[inputs.logits_indices]
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, meta)
            if inputs.logits_indices is not None:
                hidden = hidden[inputs.logits_indices]
            logits = self.model.compute_logits(hidden)
        clock.mark("forward")
        return logits, inputs.sampled_requests
