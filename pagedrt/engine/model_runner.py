"""ModelRunner: the device side of a step. Reads a StepPlan (never a `Request`), keeps its
own rows per request (`InputBatch`), runs the model and the sampler; `fetch` returns the
StepResult (docs/design.md).

Inputs of one step, for requests r_0..r_{n-1} with query lengths q_i (new tokens):

    input_ids, positions, slot_mapping   [sum q_i]      packed, request after request
    cu_seqlens_q                         [n + 1]        0, q_0, q_0+q_1, ...
    seq_lens                             [n]            num_computed_tokens_i + q_i
    block_tables                         [n, max_blocks] padded with 0

Logits are computed only for the last token of requests whose step completes their tokens
(decodes, and the last chunk of a prefill), and for every token of a sequence that verifies
drafts (speculative decoding: its last token and its j drafts, j + 1 logits rows). Apart from
those, a request asking for prompt logprobs gets them for the prompt positions its plan names
(`StepPlan.prompt_logprobs`; pagedrt/engine/prompt_logprobs.py), and such a step runs eagerly
(no CUDA graph: a graph computes the logits of its rows only); other steps are unchanged.
Beam slots among the sampled rows are expanded by the `BeamRunner` instead of sampled
(docs/design.md, "Beam search"); the drafts are written, verified and the accepted ones kept
by the `SpecRunner` (pagedrt/engine/spec_runner.py; docs/design.md, "Speculative decoding").
A multi-step decode plan (`StepPlan.num_steps` > 1) runs that many decode passes, each taking
the last one's samples as inputs on the device (`_multi_step`; docs/design.md, "Multi-step
decode").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from pagedrt.core.plan import StepPlan, StepResult
from pagedrt.engine.bad_words import OutputHistory
from pagedrt.engine.beam_runner import BeamLaunch, BeamRunner
from pagedrt.engine.cuda_graphs import CUDAGraphRunner
from pagedrt.engine.host_buffers import StepBuffers, to_device
from pagedrt.engine.input_batch import InputBatch
from pagedrt.engine.profiling import NULL_CLOCK
from pagedrt.engine.prompt_logprobs import (
    PromptLogprobsInputs,
    PromptLogprobsLaunch,
    compute_prompt_logprobs,
    plan_positions,
)
from pagedrt.engine.sampler import Sampler, SamplerOutput
from pagedrt.engine.spec_runner import SpecRunner
from pagedrt.kv.kv_cache import KVCache
from pagedrt.ops.attention import AttentionMetadata, triton_available
from pagedrt.ops.graph_inputs import (
    advance_staged_positions,
    slots_of,
    stage_decode_inputs,
    staged_block_tables,
    staged_decode_columns,
    staged_input_ids,
)
from pagedrt.spec.rejection_sampler import RejectionOutput

logger = logging.getLogger(__name__)

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
    # (the next three are None for a step staged for a decode graph: `staged`)
    input_ids: torch.Tensor | None  # [num_tokens] int64
    positions: torch.Tensor | None  # [num_tokens] int64
    meta: AttentionMetadata | None
    logits_indices: torch.Tensor | None  # [num_sampled] int64, rows of the hidden states to
    # sample; None: every row, in order (a decode step)
    sampled_rows: np.ndarray  # [num_sampled] int64, the InputBatch rows those belong to
    seq_lens: np.ndarray  # [n] int64, num_computed_tokens + num_new_tokens per request
    sampled_num_drafts: np.ndarray | None = None  # [num_sampled] int64, drafts each verifies
    # (its logits rows: 1 + that many, in order); None: no draft this step
    query_len: int = 0  # > 0: every sequence padded to this query length (verification graph)
    staged: bool = False  # the inputs are in the graph runner's `staged` buffer: a decode step
    # that replays a graph (`replay_staged`)
    prompt: PromptLogprobsInputs | None = None  # prompt positions whose logprobs the step
    # returns (the step then runs eagerly); None: none
    width: int = 0  # staged: block-table entries per row in the staged buffer


@dataclass
class LaunchedStep:
    """A step launched on the device whose sampled tokens may not be on the host yet.

    Attributes:
        step_id: the plan's.
        req_ids: the sampled sequences in row order.
        rows, epochs, positions: [num_sampled] int64: their InputBatch rows, the rows' epochs
            at launch, and the slot of each sampled token in its row.
        output: the sampler's output (token_ids [num_sampled] int64 on the device: a row
            that verified drafts has its first new token there), or None.
        spec: speculative decoding: (indices into req_ids of the rows that verified drafts,
            the rejection sampler's output for them), or None.
        host_token_ids: [num_sampled] int64 host copy of output.token_ids (pinned on CUDA),
            valid once `event` is done; None when output is None.
        event: CUDA event after the step's last work; None on CPU.
        beams: the beam searches expanded by the step, or None.
        host_verified: with `spec`, host copies (pinned on CUDA, valid once `event` is done)
            of the rejection sampler's token_ids [S, K + 1] and num_tokens [S] int64.
        prompt_logprobs: the step's prompt logprobs on the device, or None.
        multi_step_positions: a multi-step decode (`ModelRunner._multi_step`): the slots of
            the tokens of every pass but the last ([num_sampled] int64 each, in pass order;
            `positions` holds the last pass's), whose tokens `host_token_ids` then holds
            too, pass after pass ([num_steps * num_sampled]); None: one pass.
        multi_step_logprobs: a multi-step decode's logprobs, one `SamplerOutput.logprobs`
            per pass in order (the first pass's first; None for a pass where no row asked);
            None: one pass.
    """

    step_id: int
    req_ids: list[str]
    rows: np.ndarray
    epochs: np.ndarray
    positions: np.ndarray
    output: SamplerOutput | None
    host_token_ids: torch.Tensor | None
    event: torch.cuda.Event | None
    beams: BeamLaunch | None = None
    spec: tuple[list[int], RejectionOutput] | None = None
    host_verified: tuple[torch.Tensor, torch.Tensor] | None = None
    prompt_logprobs: PromptLogprobsLaunch | None = None
    multi_step_positions: list[np.ndarray] | None = None
    multi_step_logprobs: list[list | None] | None = None


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, device, backend,
                 max_num_seqs: int = 256, max_model_len: int = 2048, use_cuda_graphs: bool = False,
                 max_num_batched_tokens: int = 8192, seed: int = 0,
                 num_speculative_tokens: int = 0, spec_max_num_seqs: int = 0,
                 draft_proposer=None, num_scheduler_steps: int = 1):
        """seed: of the generator of the rows without a seed (seeded rows draw from their
        own key, pagedrt/ops/philox.py).
        num_scheduler_steps: the most passes of a multi-step decode plan (`_multi_step`),
            for the size of the host buffers its tokens come back in.
        num_speculative_tokens, spec_max_num_seqs: speculative decoding's k and the batch up
        to which it runs (CUDA graphs for verification steps are captured up to there).
        draft_proposer: the draft model (pagedrt/spec/draft_model.py) that fills -1 drafts."""
        self.model = model
        self.kv_cache = kv_cache
        self.device = torch.device(device)
        self.backend = backend
        self.block_size = kv_cache.spec.block_size
        max_blocks_per_seq = -(-max_model_len // self.block_size)
        # rows for a full batch up front: growing (a copy of every row array) mid-run would
        # land in the first steps of a burst of requests
        self.batch = InputBatch(max_model_len, self.device, num_rows=max(max_num_seqs, 8))
        self.beam_runner = BeamRunner(self.batch, kv_cache, self.device, max_num_seqs, backend)
        self.spec_runner = SpecRunner(self.batch, self.device, max_num_seqs,
                                      num_speculative_tokens, spec_max_num_seqs, draft_proposer)
        self._last_num_sampled = 0  # rows sampled by the latest launched step
        self.sampler = Sampler()
        self.sampler.check_device(self.device)
        self.draft_proposer = draft_proposer
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        # the device tensor of the sampled ids of the latest launched step, which rows with a
        # token still being sampled read their next input from (async scheduling)
        self._last_sampled: torch.Tensor | None = None
        self._last_tokens_copied = False  # ... and copied to graph_runner.last_tokens
        self._last_step_id = -1
        # two host buffers (pinned on CUDA) for what a step sends back, used in turn (one
        # step in flight): the sampled token ids, then for a step that verified drafts the
        # rejection sampler's tokens [S, k + 1] and counts [S] (`_launch`); allocated now,
        # since pinning later waits for the device. Used on the CPU too (plain copies), so
        # that tests run the same path.
        pinned = self.device.type == "cuda"
        spec_rows = min(spec_max_num_seqs, max_num_seqs) if num_speculative_tokens else 0
        self._token_buffers = StepBuffers(
            2 * max_num_seqs * max(num_scheduler_steps, 1)
            + spec_rows * (num_speculative_tokens + 2), pin=pinned)
        self.graph_runner: CUDAGraphRunner | None = None
        # the step's inputs (`prepare`), on CUDA
        self._staging: StepBuffers | None = None
        # tokens of an eager step are padded to a multiple of this (1: no padding); tests set
        # it on CPU to check that padding changes no result
        self.token_padding = EAGER_TOKEN_PADDING if self.device.type == "cuda" else 1
        max_step_tokens = -(-max(max_num_batched_tokens, max_num_seqs) // self.token_padding
                            ) * self.token_padding
        if self.device.type == "cuda":
            size = (3 * max_step_tokens + 6 * (max_num_seqs + 1)
                    + max_num_seqs * max_blocks_per_seq)
            self._staging = StepBuffers(size)
        self.max_num_seqs = max_num_seqs
        self.num_speculative_tokens = num_speculative_tokens
        self.spec_max_num_seqs = min(spec_max_num_seqs, max_num_seqs)
        self.gemm_warm_up_s = 0.0  # seconds spent in warm_up_gemms (at start-up on CUDA)
        self.graph_capture_s = 0.0  # seconds capturing the CUDA graphs (timing their ops)
        self.spec_warm_up_s = 0.0  # seconds in warm_up_speculation (start-up, CUDA, k > 0)
        if self.device.type == "cuda":
            self.warm_up_gemms(max_step_tokens, max_num_seqs)
        if use_cuda_graphs and self.device.type == "cuda":
            self.graph_runner = CUDAGraphRunner(
                model, kv_cache.layers, max_num_seqs, max_blocks_per_seq,
                self.device, backend, verify_query_len=num_speculative_tokens + 1,
                verify_max_num_seqs=self.spec_max_num_seqs, block_size=self.block_size)
            start = time.perf_counter()
            self.graph_runner.capture()
            self.graph_capture_s = time.perf_counter() - start
            self._log_capture()
        if self.device.type == "cuda" and num_speculative_tokens:
            self.warm_up_speculation()

    def _log_capture(self) -> None:
        """The capture's time and, where Triton is installed, the start-up timing's totals so
        far in this process (`config_timing.TOTALS`), at INFO: a fresh start spends most of
        a minute here (docs/design.md, "Small-batch decode")."""
        totals = ""
        if triton_available():
            from pagedrt.ops.config_timing import TOTALS

            totals = f"; kernel configs so far: {TOTALS.summary()}"
        logger.info("CUDA graphs: %d captured in %.1f s%s", len(self.graph_runner.graphs),
                    self.graph_capture_s, totals)

    @torch.inference_mode()
    def warm_up_gemms(self, max_step_tokens: int, max_num_seqs: int) -> None:
        """Run every matmul shape a step with prompt tokens can take once, so that no kernel
        is loaded for the first time mid-run (see EAGER_TOKEN_PADDING): each linear layer's
        weight at every padded token count up to `max_step_tokens`, and the LM head at 1 to
        `max_num_seqs` rows (one per sampled request); then the sampler's Triton kernels on
        one row's logits (`Sampler.warm_up`). Sets `gemm_warm_up_s`."""
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
            logits = self.model.compute_logits(h[:m])
            if m == 1:
                self.sampler.warm_up(logits)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.gemm_warm_up_s = time.perf_counter() - start

    def warm_up_speculation(self) -> None:
        """Run the verification path once at start-up (`SpecRunner.warm_up`: two steps on
        throwaway rows, which leave nothing the host sees), so that the first real
        verification step costs what later ones do. Sets `spec_warm_up_s`. Does nothing
        without speculation (k = 0) or when max_model_len leaves no room for a draft.

        Raises:
            ValueError: called while the runner holds rows (it runs before any request).
        """
        seconds = self.spec_runner.warm_up(self)
        if seconds is not None:
            self.spec_warm_up_s = seconds

    @contextlib.contextmanager
    def throwaway_steps(self) -> Iterator[None]:
        """Steps run inside (start-up warm-ups, their rows dropped before the end) draw from a
        generator of their own, not the default one, and leave no step in flight: the next
        step reads no input id from theirs."""
        generator = self.generator  # warm-up draws must not move the real stream
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        try:
            yield
        finally:
            self.generator = generator
            self._last_sampled = None
            self._last_tokens_copied = False
            self._last_step_id = -1
            self._last_num_sampled = 0

    def prepare(self, plan: StepPlan, rows: np.ndarray,
                num_drafts: np.ndarray | None = None) -> ModelInputs:
        """Build the step's input tensors with numpy from the plan and the InputBatch rows
        (`rows`: [n] int64, those of plan.req_ids, from `InputBatch.apply`) and move them in
        one host-to-device copy.

        A row whose last token is still being sampled by the previous step (async scheduling)
        takes that input id from the previous step's sampled ids, on the device, without
        waiting for the host.

        num_drafts: [n] int64, drafts each row verifies (written past its tokens by
        `SpecRunner.write_drafts`), or None. When every row is a decode (1 token + its drafts)
        and a verification graph fits (`SpecRunner.verify_query_len`), every row is padded to
        q = k + 1 tokens (padding: id 0, the row's first position, slot -1; see
        pagedrt/engine/cuda_graphs.py).
        """
        bs = self.block_size
        batch = self.batch
        n = len(rows)
        q_lens = np.asarray(plan.num_new_tokens, dtype=np.int64)  # [n]
        starts = np.asarray(plan.num_computed_tokens, dtype=np.int64)  # [n]
        totals = batch.num_tokens[rows]  # [n] tokens of each row
        if num_drafts is not None:
            totals = totals + num_drafts  # (the drafts sit past the row's tokens)
        ends = starts + q_lens
        num_tokens = int(q_lens.sum())
        width = max(int(batch.num_blocks[rows].max()), 1)
        block_tables = batch.block_table[rows, :width]  # [n, width]
        if num_tokens == n:  # every request has one new token (decode)
            cu = np.arange(n + 1, dtype=np.int64)
            positions = starts
            token_rows = rows
            table_rows = cu[:n]
        else:
            cu = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(q_lens, out=cu[1:])
            table_rows = np.repeat(np.arange(n), q_lens)  # request of each token
            positions = np.arange(num_tokens) - cu[table_rows] + starts[table_rows]
            token_rows = rows[table_rows]
        # (a token still being sampled reads -1 here; it is replaced on the device below)
        input_ids = batch.token_ids[token_rows, positions].astype(np.int64)
        block_index, offset = np.divmod(positions, bs)
        slot_mapping = block_tables[table_rows, block_index] * bs + offset
        is_sampled = ends == totals  # the step completes the row's tokens
        sampled_idx = np.flatnonzero(is_sampled)
        logits_indices = cu[1:][sampled_idx] - 1
        sampled_num_drafts = None
        if num_drafts is not None:  # every token of a verifying row: x d_1 .. d_j
            sampled_num_drafts = num_drafts[sampled_idx]
            counts = sampled_num_drafts + 1
            first = np.repeat(logits_indices - sampled_num_drafts, counts)
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts,
                                                               counts)
            logits_indices = first + offsets
        # tokens still being sampled (always a row's last token): (token index, row in the
        # previous step's sampled ids)
        pending = batch.pending[rows]
        pend = np.flatnonzero(is_sampled & (pending >= 0))
        pend_dst = cu[1:][pend] - 1
        pend_src = pending[pend]
        prompt_ranges = plan.prompt_logprobs
        prompt_index = prompt_targets = np.zeros(0, dtype=np.int64)
        if prompt_ranges:  # (positions of prompt logprobs: only their requests pay)
            prompt_ids, prompt_counts, prompt_top, prompt_index, prompt_targets = plan_positions(
                prompt_ranges, plan.req_ids, rows, starts, cu, batch.token_ids, batch.states)
        if len(pend):
            assert (batch.pending_step[rows[pend]] == self._last_step_id).all(), (
                f"tokens pending from steps {batch.pending_step[rows[pend]].tolist()}, "
                f"the step in flight is {self._last_step_id}")
            assert num_drafts is None or not num_drafts[pend].any(), (
                "drafts after a token still being sampled")
        query_len = 0 if num_drafts is None or prompt_ranges else (
            self.spec_runner.verify_query_len(self.graph_runner, num_drafts, q_lens, ends, n,
                                              width))
        runner = self.graph_runner
        if (num_tokens == n and not query_len and not prompt_ranges and runner is not None
                and runner.staged_inputs and runner.can_run(n, width)):
            return self._stage_decode(rows, starts, ends, input_ids, slot_mapping, block_tables,
                                      sampled_idx, logits_indices, pend, pend_dst, pend_src)
        kernel_seq_lens = ends
        if query_len:
            # pad every row to query_len tokens: token t of row i sits at i * query_len + t
            where = (np.arange(num_tokens) - cu[table_rows]) + table_rows * query_len
            padded = np.zeros(n * query_len, np.int64)
            padded[where] = input_ids
            input_ids = padded
            padded = np.repeat(starts, query_len)
            padded[where] = positions
            positions = padded
            padded = np.full(n * query_len, -1, np.int64)
            padded[where] = slot_mapping
            slot_mapping = padded
            logits_indices = where[logits_indices]
            pend_dst = where[pend_dst]
            cu = np.arange(n + 1, dtype=np.int64) * query_len
            kernel_seq_lens = starts + query_len
        else:
            num_padding = -num_tokens % self.token_padding
            if num_padding and num_tokens > n:
                # a step with prompt tokens runs eagerly: pad (see EAGER_TOKEN_PADDING); decode
                # steps are replays of graphs captured at padded batch sizes
                input_ids = np.concatenate([input_ids, np.zeros(num_padding, np.int64)])
                positions = np.concatenate([positions, np.zeros(num_padding, np.int64)])
                slot_mapping = np.concatenate([slot_mapping, np.full(num_padding, -1, np.int64)])
        # beam slots whose expansion is in flight: their block tables are re-parented on the
        # device (async scheduling; see BeamRunner)
        patch = self.beam_runner.table_patch(rows, pend, starts, self._last_num_sampled)
        # one staging buffer, one copy: the int64 parts, then the int32 ones packed two to an
        # int64 (viewed back as int32 on the device: no conversion kernels)
        #   [ids | positions | slots | logits | pending dst | pending src | prompt logprobs'
        #    hidden rows, targets | cu, seq_lens, tables | beam table patch]
        small = np.zeros(-(-(2 * n + 1 + n * width) // 2) * 2, dtype=np.int32)  # (even)
        small[: n + 1] = cu
        small[n + 1: 2 * n + 1] = kernel_seq_lens
        small[2 * n + 1: 2 * n + 1 + n * width] = block_tables.ravel()
        parts = [input_ids, positions, slot_mapping, logits_indices, pend_dst, pend_src,
                 prompt_index, prompt_targets, small.view(np.int64)] + (patch or [])
        flat = np.concatenate(parts)
        flat = (torch.from_numpy(flat) if self._staging is None
                else self._staging.to_device(flat, self.device))
        (ids_t, pos_t, slot_t, logit_t, dst_t, src_t, prompt_index_t, prompt_targets_t, small_t,
         *patch_t) = torch.split(flat, [len(x) for x in parts])
        cu_t, lens_t, tables_t = torch.split(small_t.view(torch.int32)[: len(cu) + n + n * width],
                                             [n + 1, n, n * width])
        if patch_t:
            self.beam_runner.apply_table_patch(tables_t.view(n, width), patch_t)
        if len(pend):
            assert self._last_sampled is not None, "tokens pending but no step in flight"
            ids_t.index_copy_(0, dst_t, self._last_sampled.index_select(0, src_t))
        meta = AttentionMetadata(
            slot_mapping=slot_t,
            block_tables=tables_t.view(n, width),
            seq_lens=lens_t,
            cu_seqlens_q=cu_t,
            max_query_len=query_len or int(q_lens.max()),
            max_seq_len=int(kernel_seq_lens.max()),
            backend=self.backend,
        )
        # a decode step samples every row in order: its logits need no gather
        all_rows = len(sampled_idx) == n == num_tokens and not query_len
        return ModelInputs(
            input_ids=ids_t, positions=pos_t, meta=meta,
            logits_indices=None if all_rows else logit_t,
            sampled_rows=rows if all_rows else rows[sampled_idx], seq_lens=ends,
            sampled_num_drafts=sampled_num_drafts, query_len=query_len,
            prompt=PromptLogprobsInputs(prompt_ids, prompt_counts, prompt_top, prompt_index_t,
                                        prompt_targets_t) if prompt_ranges else None,
        )

    def _stage_decode(self, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                      input_ids: np.ndarray, slot_mapping: np.ndarray, block_tables: np.ndarray,
                      sampled_idx: np.ndarray, logits_indices: np.ndarray, pend: np.ndarray,
                      pend_dst: np.ndarray, pend_src: np.ndarray) -> ModelInputs:
        """`prepare`'s end for a decode step that replays a graph: the inputs go in one copy
        into the graph runner's `staged` buffer (layout: pagedrt/ops/graph_inputs.py), and the
        graph itself reads the pending input ids from `last_tokens`. After it on the device,
        where needed: the pending ids gathered into `staged` (a previous step that sampled
        more rows than `last_tokens` holds) and the beam slots' table patch. Arrays as `prepare`
        computed them: [n] aligned with rows, block_tables [n, width], the sampled and pending
        ones' indices."""
        runner = self.graph_runner
        n, width = block_tables.shape
        pending_src = np.full(n, -1, dtype=np.int64)
        gather = bool(len(pend)) and not self._last_tokens_copied
        if len(pend) and not gather:
            pending_src[pend_dst] = pend_src
        patch = self.beam_runner.table_patch(rows, pend, starts, self._last_num_sampled)
        all_rows = len(sampled_idx) == n
        # after the staged layout: [logits rows | pending dst, src | beam table patch], each
        # where needed
        tail = (([] if all_rows else [logits_indices]) + ([pend_dst, pend_src] if gather else [])
                + (patch or []))
        flat = stage_decode_inputs(input_ids, starts, slot_mapping, pending_src, ends,
                                   block_tables)
        size = len(flat)
        spill = bool(tail) and size + sum(len(x) for x in tail) > runner.staged.numel()
        if tail and not spill:
            flat = np.concatenate([flat] + tail)
        if self._staging is not None:
            staged = self._staging.copy_into(flat, runner.staged)
        else:  # (CPU: the tests' eager "graphs")
            staged = runner.staged[: len(flat)]
            staged.copy_(torch.from_numpy(flat))
        if spill:  # (the tail does not fit after the inputs: a copy of its own)
            extra = to_device(np.concatenate(tail), self.device, torch.int64)
        else:
            extra = staged[size:]
        tail_t = list(torch.split(extra, [len(x) for x in tail])) if tail else []
        logit_t = None if all_rows else tail_t.pop(0)
        dst_t, src_t = (tail_t.pop(0), tail_t.pop(0)) if gather else (None, None)
        patch_t = tail_t
        if gather:
            assert self._last_sampled is not None, "tokens pending but no step in flight"
            staged_input_ids(staged, n).index_copy_(
                0, dst_t, self._last_sampled.index_select(0, src_t))
        if patch_t:
            self.beam_runner.apply_table_patch(staged_block_tables(runner.staged, n, width),
                                               patch_t)
        return ModelInputs(
            input_ids=None, positions=None, meta=None,
            logits_indices=logit_t, sampled_rows=rows if all_rows else rows[sampled_idx],
            seq_lens=ends, staged=True, width=width)

    @torch.inference_mode()
    def execute(self, plan: StepPlan, clock=NULL_CLOCK) -> LaunchedStep | None:
        """Bring the rows up to the plan; if it schedules anything, apply its block copies,
        run the model and sample (forking rows as the plan says; verifying drafts). Returns
        before the device is done (`fetch` waits), or None for a plan that runs nothing."""
        if self.draft_proposer is not None:
            self.draft_proposer.forget(plan.finished_req_ids + plan.preempted_req_ids)
        rows = self.batch.apply(plan)
        if not plan:
            return None
        if plan.copies:
            self.kv_cache.apply(plan.copies)
            if self.draft_proposer is not None:
                self.draft_proposer.apply_copies(plan.copies)
        num_drafts = self.spec_runner.write_drafts(plan, rows) if plan.draft_token_ids else None
        inputs = self.prepare(plan, rows, num_drafts)
        self.batch.num_computed_tokens[rows] = inputs.seq_lens
        clock.mark("prepare")
        meta = inputs.meta
        prompt = None
        if inputs.staged:
            logits = self.graph_runner.replay_staged(len(rows))
            if inputs.logits_indices is not None:
                logits = logits[inputs.logits_indices]
        elif (self.graph_runner is not None and meta.is_decode_only and inputs.prompt is None
                and self.graph_runner.can_run(len(rows), meta.block_tables.shape[1])):
            logits = self.graph_runner.run(inputs.input_ids, inputs.positions, meta.slot_mapping,
                                           meta.seq_lens, meta.block_tables)
            if inputs.logits_indices is not None:
                logits = logits[inputs.logits_indices]
        elif inputs.query_len:
            logits = self.graph_runner.run(inputs.input_ids, inputs.positions, meta.slot_mapping,
                                           meta.seq_lens, meta.block_tables, inputs.query_len)
            logits = logits[inputs.logits_indices]
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, meta)
            if inputs.prompt is not None:
                prompt = compute_prompt_logprobs(self.model, hidden, inputs.prompt)
            if inputs.logits_indices is not None:
                hidden = hidden[inputs.logits_indices]
            logits = self.model.compute_logits(hidden)
        clock.mark("forward")
        sampled_rows = inputs.sampled_rows
        if inputs.sampled_num_drafts is not None:
            output, rows_out, spec = self.spec_runner.sample(
                plan, logits, sampled_rows, inputs.sampled_num_drafts, self.generator,
                self._run_sampler, self._fork)
            return self._launch(plan.step_id, output, rows_out, None, clock, spec=spec,
                                prompt=prompt)
        index = None
        if plan.forks:
            index, sampled_rows = self._fork(plan, sampled_rows)
            logits = logits[torch.tensor(index, device=logits.device)]
        # every scheduled row sampled, in order (a decode step): the plan has their ids
        req_ids = plan.req_ids if sampled_rows is rows else None
        if plan.num_steps > 1:
            return self._multi_step(plan, inputs, logits, rows, clock)
        return self._sample(plan.step_id, logits, sampled_rows, req_ids, clock, rows, prompt)

    def _multi_step(self, plan: StepPlan, inputs: ModelInputs, logits: torch.Tensor,
                    rows: np.ndarray, clock) -> LaunchedStep:
        """The passes of a multi-step decode plan (docs/design.md, "Multi-step decode"): every
        row decodes one token per pass, and each pass after the first takes the tokens the
        one before it sampled as inputs, on the device (a staged step by one kernel,
        `CUDAGraphRunner.advance_staged`; else `_next_pass_logits`), without the host reading
        them. The sampler runs once per pass, after the rows' token counts
        have moved on by the passes before (seeded draws and min_tokens read them); the
        tokens of every pass come back in one copy (`_launch`). `logits`: [n, vocab], the
        first pass's."""
        num_steps, n = plan.num_steps, len(rows)
        tokens = torch.empty((num_steps, n), dtype=torch.int64, device=logits.device)
        positions = []
        logprobs = []  # (each pass's, gathered to the host by the sampler where rows ask)
        runner = self.graph_runner
        # a staged step moves on by one kernel, its pending ids read from `last_tokens`
        fused = inputs.staged and n <= runner.last_tokens.numel()
        for i in range(num_steps):
            if i:
                positions.append(self.batch.append_sampled(rows, plan.step_id))
                if fused:  # (which also copies the last pass's samples to tokens[i - 1])
                    runner.advance_staged(n, inputs.width, tokens[i - 1])
                    logits = runner.replay_staged(n)
                else:
                    logits = self._next_pass_logits(inputs, tokens[i - 1], n)
            output = self._run_sampler(logits, rows)
            logprobs.append(output.logprobs)
            if not fused or i == num_steps - 1:
                tokens[i].copy_(output.token_ids)
            elif output.token_ids.data_ptr() != runner.last_tokens.data_ptr():
                runner.last_tokens[:n].copy_(output.token_ids)  # (plain greedy writes there)
        self.batch.num_computed_tokens[rows] = inputs.seq_lens + num_steps - 1
        return self._launch(plan.step_id, output, rows, plan.req_ids, clock,
                            multi_step=(tokens, positions, logprobs))

    def _next_pass_logits(self, inputs: ModelInputs, token_ids: torch.Tensor,
                          n: int) -> torch.Tensor:
        """The logits ([n, vocab]) of the next pass of a multi-step decode whose last pass's
        inputs are `inputs` (a decode step's: one token per row, every row sampled), each
        row's input now `token_ids` ([n] int64 on the device, the last pass's samples) one
        position further on. Moves `inputs` on by that pass, in place: in the graph runner's
        staged buffer (pagedrt/ops/graph_inputs.py, its pending sources cleared), or as new
        eager tensors. (`_multi_step` moves a staged step on by one kernel instead where
        `last_tokens` holds its rows.)"""
        bs = self.block_size
        if inputs.staged:
            runner = self.graph_runner
            ids, _, _, pending_src = staged_decode_columns(runner.staged, n)
            ids.copy_(token_ids)
            pending_src.fill_(-1)
            advance_staged_positions(runner.staged, n, inputs.width, bs)
            return runner.replay_staged(n)
        meta = inputs.meta
        positions = inputs.positions + 1
        block_tables = meta.block_tables
        slot_mapping = slots_of(block_tables, positions, bs)
        meta = AttentionMetadata(
            slot_mapping=slot_mapping, block_tables=block_tables, seq_lens=meta.seq_lens + 1,
            cu_seqlens_q=meta.cu_seqlens_q, max_query_len=1,
            max_seq_len=meta.max_seq_len + 1, backend=self.backend)
        inputs.input_ids, inputs.positions, inputs.meta = token_ids, positions, meta
        runner = self.graph_runner
        if (runner is not None and not runner.staged_inputs
                and runner.can_run(n, block_tables.shape[1])):
            return runner.run(token_ids, positions, slot_mapping, meta.seq_lens, block_tables)
        hidden = self.model(token_ids, positions, self.kv_cache.layers, meta)
        return self.model.compute_logits(hidden)

    def _fork(self, plan: StepPlan, sampled_rows: np.ndarray) -> tuple[list[int], np.ndarray]:
        """Rows for the forked samples, each after its parent's, sampling from the parent's
        logits row: (the logits row of each sampled row, the sampled rows)."""
        batch = self.batch
        index, new_rows = [], []
        for i, row in enumerate(sampled_rows.tolist()):
            index.append(i)
            new_rows.append(row)
            child_ids = plan.forks.get(batch.states[row].req_id, ())
            for k, child_id in enumerate(child_ids, start=1):
                index.append(i)
                new_rows.append(batch.fork(row, child_id, k))
        assert len(new_rows) == len(sampled_rows) + sum(map(len, plan.forks.values())), (
            f"forks {plan.forks} of rows that the step does not sample")
        return index, np.asarray(new_rows, dtype=np.int64)

    def _run_sampler(self, logits: torch.Tensor, rows: np.ndarray) -> SamplerOutput | None:
        """Sample one token per row of `rows` ([B] int64, in logits order) from the batch's
        persistent settings (`Sampler.sample_rows`); None for no row. While some row has
        bad-word sequences, the sampler also gets the rows' tokens and the step in flight's
        sampled ids (a row's last token may still be among them: pagedrt/engine/
        bad_words.py)."""
        if not len(rows):
            return None
        batch = self.batch
        runner, out = self.graph_runner, None
        if runner is not None and runner.staged_inputs and len(rows) <= runner.last_tokens.numel():
            out = runner.last_tokens[: len(rows)]  # (greedy rows: the next graph reads it)
        history = None
        if batch.sampling.bad_words.num_rows:
            history = OutputHistory(batch.token_ids, batch.pending, self._last_sampled)
        return self.sampler.sample_rows(logits, batch.sampling, rows, batch.states,
                                        batch.num_tokens, self.generator, out=out,
                                        history=history)

    def _sample(self, step_id: int, logits: torch.Tensor, rows: np.ndarray,
                req_ids: list[str] | None, clock, scheduled_rows: np.ndarray,
                prompt: PromptLogprobsLaunch | None = None) -> LaunchedStep:
        """Sample one token per row (expanding beam searches where rows are beam slots)."""
        batch = self.batch
        is_beam = batch.is_beam[rows]
        beams = None
        if is_beam.any():
            output, beams = self._sample_with_beams(logits, rows, is_beam, scheduled_rows)
        else:
            output = self._run_sampler(logits, rows)
        return self._launch(step_id, output, rows, req_ids, clock, beams=beams, prompt=prompt)

    def _launch(self, step_id: int, output: SamplerOutput | None, rows: np.ndarray,
                req_ids: list[str] | None, clock, beams: BeamLaunch | None = None,
                spec: tuple[list[int], RejectionOutput] | None = None,
                prompt: PromptLogprobsLaunch | None = None,
                multi_step: tuple[torch.Tensor, list[np.ndarray], list] | None = None,
                ) -> LaunchedStep:
        """Append a placeholder per sampled row, start the copy of what `fetch` reads to the
        host, and return the step's handle (`fetch` reads it).

        The copies go into this step's buffer of `_token_buffers` (`StepBuffers`, two used in
        turn: with one step in flight, the other one's step has been fetched), non-blocking on
        CUDA:

            [first tokens (num_sampled) | verified tokens (S * (K + 1)) | counts (S)]

        the last two only for a step that verified drafts (`spec`); when every sampled row
        verified drafts, the first tokens are the verified tokens' first column (`output`'s
        token_ids is that column: `SpecRunner.sample`), read from there, not copied. A
        multi-step decode (`multi_step`: its tokens [num_steps, n] on the device, the slots
        of its passes but the last, and each pass's `SamplerOutput.logprobs`) copies every
        pass's tokens, pass after pass, in place of the first tokens; `output` is then its
        last pass's."""
        batch = self.batch
        states = batch.states
        if beams is None:
            self.beam_runner.last_parent_index = None
        self._last_num_sampled = len(rows)
        positions = batch.append_sampled(rows, step_id)
        host, host_verified, event = None, None, None
        if output is not None:
            cuda = self.device.type == "cuda"
            all_verified = spec is not None and len(spec[0]) == len(rows)
            num_first = (0 if all_verified else len(rows) if multi_step is None
                         else multi_step[0].numel())
            size = num_first
            if spec is not None:
                num_spec, width = spec[1].token_ids.shape
                size += num_spec * (width + 1)
            self._token_buffers.next_step()
            buffer = self._token_buffers.take(size)
            if spec is not None:
                verified = spec[1]
                tokens = buffer[num_first: num_first + num_spec * width].view(num_spec, width)
                counts = buffer[num_first + num_spec * width: size]
                tokens.copy_(verified.token_ids, non_blocking=cuda)
                counts.copy_(verified.num_tokens, non_blocking=cuda)
                host_verified = (tokens, counts)
            if all_verified:
                host = host_verified[0][:, 0]
            else:
                host = buffer[:num_first]
                host.copy_(output.token_ids if multi_step is None else multi_step[0].view(-1),
                           non_blocking=cuda)
        if self.device.type == "cuda":
            # recorded for every step, sampled rows or not: waiting on it in `fetch` is what
            # makes the step's pinned input buffer free for reuse two steps later
            event = torch.cuda.Event()
            event.record()
        self._last_sampled = output.token_ids if output is not None else None
        self._last_tokens_copied = False
        runner = self.graph_runner
        if (output is not None and runner is not None and runner.staged_inputs
                and len(rows) <= runner.last_tokens.numel()):
            # where the next decode graph reads the input ids pending from this step (a
            # greedy batch's sampler wrote them there: `_run_sampler`)
            if output.token_ids.data_ptr() != runner.last_tokens.data_ptr():
                runner.last_tokens[: len(rows)].copy_(output.token_ids, non_blocking=True)
            self._last_tokens_copied = True
        self._last_step_id = step_id
        clock.mark("sample")
        if req_ids is None:
            req_ids = [states[r].req_id for r in rows.tolist()]
        step = LaunchedStep(step_id, req_ids, rows, batch.epoch[rows], positions, output,
                            host, event, beams, spec, host_verified, prompt)
        if multi_step is not None:
            _, step.multi_step_positions, step.multi_step_logprobs = multi_step
        return step

    def _sample_with_beams(self, logits: torch.Tensor, rows: np.ndarray, is_beam: np.ndarray,
                           scheduled_rows: np.ndarray) -> tuple[SamplerOutput, BeamLaunch]:
        """Sample the rows that are not beam slots, expand the searches of those that are;
        one token per row either way (a slot's: the token of the candidate it continues)."""
        beam_index = np.flatnonzero(is_beam)
        other = np.flatnonzero(~is_beam)
        token_ids = None
        logprobs = None
        if len(other):
            token_ids = torch.zeros(len(rows), dtype=torch.int64, device=logits.device)
            other_t = torch.from_numpy(other)
            if logits.device.type == "cuda":  # (pinned: a pageable copy waits for the stream)
                other_t = other_t.pin_memory()
            other_t = other_t.to(logits.device, non_blocking=True)
            sampled = self._run_sampler(logits.index_select(0, other_t), rows[other])
            token_ids.index_copy_(0, other_t, sampled.token_ids)
            if sampled.logprobs is not None:
                logprobs = [None] * len(rows)
                for i, entry in zip(other.tolist(), sampled.logprobs):
                    logprobs[i] = entry
        # each sampled row's position among the scheduled ones (-1: forked this step)
        position_of = np.full(len(self.batch.is_beam), -1, dtype=np.int64)
        position_of[scheduled_rows] = np.arange(len(scheduled_rows))
        eos = self.batch.states[rows[beam_index[0]]].eos_token_ids
        token_ids, beams = self.beam_runner.sample(logits, rows, beam_index, position_of[rows],
                                                   token_ids, eos)
        return SamplerOutput(token_ids, logprobs), beams

    def fetch(self, step: LaunchedStep) -> StepResult:
        """Wait for a launched step, write its sampled tokens into their rows and return
        them (and, for rows that verified drafts, their further tokens, whose rows then move
        their computed count back over the rejected drafts; and the prompt logprobs the plan
        asked for)."""
        if step.event is not None:
            step.event.synchronize()
        prompt = {} if step.prompt_logprobs is None else step.prompt_logprobs.to_host()
        if step.output is None:
            return StepResult(prompt_logprobs=prompt)
        token_ids = step.host_token_ids.tolist()
        passes = []
        if step.multi_step_positions is not None:  # [first pass | ... | last pass]
            n = len(step.rows)
            passes = [token_ids[i: i + n] for i in range(0, len(token_ids), n)]
            self.batch.write_earlier_passes(step.rows, step.epochs, step.multi_step_positions,
                                            passes[:-1])
            token_ids = passes.pop(0)
        self.batch.write_sampled(step.req_ids, step.rows, step.epochs, step.positions,
                                 passes[-1] if passes else token_ids, step.step_id)
        result = StepResult(step.req_ids, token_ids, step.output.logprobs,
                            prompt_logprobs=prompt, multi_step_token_ids=passes)
        if step.multi_step_logprobs is not None:  # (`output` is the last pass's)
            result.logprobs, *result.multi_step_logprobs = step.multi_step_logprobs
        if step.beams is not None:
            result.beams = self.beam_runner.results(step.beams)
        if step.spec is not None:
            self.spec_runner.results(step, result)
        return result
