"""The model runner's speculative-decoding part: a step's drafts are verified on the device, and
the rows keep the accepted ones (docs/design.md, "Speculative decoding").

A sequence with drafts d_1..d_j after its last token x runs the query x d_1 .. d_j (1 + j
tokens) and gets j + 1 logits rows, verified by the rejection sampler
(pagedrt/spec/rejection_sampler.py). In a step whose plan carries drafts:

  1. `write_drafts` (before `ModelRunner.prepare`): the drafts go into the row's token ids past
     its last token (scratch until accepted; the draft model proposes the -1 ones first), where
     `prepare` reads them as the row's query tokens and takes logits at each of its positions.
  2. `verify_query_len` (in `prepare`): when every row is a decode (1 token and its drafts)
     and a verification graph fits, every row is padded to q = num_speculative_tokens + 1
     tokens (pagedrt/engine/cuda_graphs.py).
  3. `sample`: rows without drafts (and forked children) go through the plain sampler, the
     others through the rejection sampler; the first new token of each row is merged into one
     [num_out] int64 tensor in row order (forks after their parent), which
     `ModelRunner._launch` copies to the host as any step's sampled tokens, with the verified
     tokens [S, k + 1] and counts [S]. The host's inputs go to the device in one int64 copy:

         [drafts (S * k) | logits rows to gather (S * (k + 1)) | logits rows of the plain
          rows (num_plain) | merge order (num_out)]

     the last three only where they are not the identity.
  4. `results` (in `ModelRunner.fetch`): each row gets its accepted drafts and the target's
     token; its computed count moves back over the rejected drafts.

S: the rows that verify drafts; k: the most drafts one of them verifies in the step (a row with
fewer pads its drafts with 0 and its logits rows with its last one); num_plain: the other
sampled rows and their forked children; num_out = S + num_plain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedrt.core.plan import NewRequestData, StepPlan, StepResult
from pagedrt.core.request import PLACEHOLDER_TOKEN_ID
from pagedrt.engine.host_buffers import StepBuffers, to_device
from pagedrt.engine.input_batch import InputBatch
from pagedrt.engine.sampler import SamplerOutput
from pagedrt.sampling_params import SamplingParams
from pagedrt.spec.rejection_sampler import RejectionOutput, RejectionSampler

if TYPE_CHECKING:
    from pagedrt.engine.cuda_graphs import CUDAGraphRunner
    from pagedrt.engine.model_runner import LaunchedStep, ModelRunner


class SpecRunner:
    """Draft verification and row bookkeeping for one ModelRunner (its InputBatch).

    Per step that verifies drafts: one host-to-device copy of the drafts and index arrays, the
    rejection sampler (5 tensor ops when every row is greedy without penalties, min_tokens or
    logprobs), a logits gather and a merge only where they are not the identity."""

    def __init__(self, batch: InputBatch, device: torch.device, max_num_seqs: int = 256,
                 num_speculative_tokens: int = 0, spec_max_num_seqs: int = 0,
                 draft_proposer=None) -> None:
        """num_speculative_tokens, spec_max_num_seqs: speculative decoding's k and the batch up
        to which it runs. draft_proposer: the draft model (pagedrt/spec/draft_model.py) that
        fills -1 drafts, or None."""
        self.batch = batch
        self.device = device
        self.max_num_seqs = max_num_seqs
        self.num_speculative_tokens = num_speculative_tokens
        self.spec_max_num_seqs = min(spec_max_num_seqs, max_num_seqs)
        self.draft_proposer = draft_proposer
        self.rejection_sampler = RejectionSampler()
        # the small inputs of a step that verifies drafts (logits gather, drafts, merge order;
        # `sample`), pinned, on CUDA with speculation
        spec_rows = self.spec_max_num_seqs if num_speculative_tokens else 0
        self._staging = StepBuffers(max(
            4 * max_num_seqs + spec_rows * (2 * num_speculative_tokens + 1), 1 << 10)) if (
                device.type == "cuda" and num_speculative_tokens) else None

    # ----------------------------------------------------------------- start-up
    @torch.inference_mode()
    def warm_up(self, runner: ModelRunner) -> float | None:
        """Run the verification path once at start-up, so that the first real verification
        step costs what later ones do. Without it the first one loaded the rejection
        sampler's kernels mid-run (about 97 ms on the H200; pagedrt/spec/config.py).

        Two steps through the runner's `execute` and `fetch` on three throwaway rows of a few
        tokens: a greedy row, a sampled one (top-k, top-p, min-p, logprobs) and a seeded one
        with penalties and min_tokens, so the rejection sampler runs its greedy and sampling
        paths. The first step verifies k drafts per row (a verification graph when captured);
        the second verifies again beside a prefill chunk, which runs it eagerly. With a draft
        model the drafts are proposed by it (its extend and decode passes). The LM head also
        runs at every row count a verification step can take above `max_num_seqs` (up to
        (k + 1) x the batch it speculates at), as `ModelRunner.warm_up_gemms` does below.

        What it leaves: nothing the host sees. The rows are dropped (a third plan lists them
        as finished), the runner's default generator is put back as it was and no step is
        left in flight (`ModelRunner.throwaway_steps`), and the host's KV manager and counters
        are never touched; the K/V written into blocks 0.. are those of free blocks, which a
        request writes before it reads.

        Args:
            runner: the ModelRunner that owns this one.
        Returns:
            the seconds it took, or None when it ran nothing: without speculation (k = 0) or
            when max_model_len leaves no room for a draft.
        Raises:
            ValueError: called while the runner holds rows (it runs before any request).
        """
        k = self.num_speculative_tokens
        batch = self.batch
        if batch.row_of:
            raise ValueError(f"warm_up_speculation runs before any request, but "
                             f"{len(batch.row_of)} rows are in use; call it at start-up")
        if k < 1:
            return None
        start = time.perf_counter()
        model = runner.model
        vocab = model.config.vocab_size
        num_blocks = runner.kv_cache.k_all.shape[1]
        num_known = 3  # 2 prompt tokens and 1 generated, the last one known
        room = batch.max_model_len - num_known - 1  # drafts that fit the first step
        if room < 1:
            return None
        ids = [(7 + 13 * i) % vocab for i in range(num_known + 2 * k + 2)]
        table_len = -(-min(num_known + 2 * k + 2, batch.max_model_len) // runner.block_size)
        blocks = [min(b, num_blocks - 1) for b in range(table_len)]
        params = [
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, logprobs=2),
            SamplingParams(temperature=1.0, seed=0, repetition_penalty=1.1,
                           presence_penalty=0.5, frequency_penalty=0.5, min_tokens=4),
        ]
        req_ids = [f"spec-warm-up-{i}" for i in range(len(params))]
        placeholders = self.draft_proposer is not None  # the draft model fills -1 slots

        def drafts(n: int) -> list[int]:
            return [PLACEHOLDER_TOKEN_ID] * n if placeholders else ids[:n]

        with runner.throwaway_steps():
            j = min(k, room)
            first = StepPlan(
                step_id=0, req_ids=list(req_ids), num_new_tokens=[1 + j] * len(req_ids),
                num_computed_tokens=[num_known - 1] * len(req_ids),
                new_requests=[NewRequestData(r, ids[:2], [ids[2]], p, 0, (), list(blocks),
                                             num_known - 1)
                              for r, p in zip(req_ids, params)],
                draft_token_ids={r: drafts(j) for r in req_ids})
            runner.fetch(runner.execute(first))
            # again, eagerly: a prefill chunk beside the rows (their drafts where they fit)
            second = StepPlan(step_id=1, new_requests=[NewRequestData(
                "spec-warm-up-chunk", ids[:3], [], params[0], 0, (), list(blocks), 0)])
            for r in req_ids:
                row = batch.row_of[r]
                n = int(batch.num_tokens[row])
                j = max(min(k, batch.max_model_len - n - 1), 0)
                second.req_ids.append(r)
                second.num_new_tokens.append(1 + j)
                second.num_computed_tokens.append(n - 1)
                if j:
                    second.draft_token_ids[r] = drafts(j)
            second.req_ids.append("spec-warm-up-chunk")
            second.num_new_tokens.append(2)
            second.num_computed_tokens.append(0)
            runner.fetch(runner.execute(second))
            runner.execute(StepPlan(step_id=2,
                                    finished_req_ids=[*req_ids, "spec-warm-up-chunk"]))
            # the LM head at the row counts of verification steps above warm_up_gemms' range
            most = (k + 1) * self.spec_max_num_seqs
            if most > self.max_num_seqs:
                h = torch.zeros(most, model.config.hidden_size,
                                dtype=next(model.parameters()).dtype, device=self.device)
                for m in range(self.max_num_seqs + 1, most + 1):
                    model.compute_logits(h[:m])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    # ----------------------------------------------------------------- the step's inputs
    def write_drafts(self, plan: StepPlan, rows: np.ndarray) -> np.ndarray:
        """Write the plan's drafts past each row's tokens (the draft model proposes the -1
        ones now). rows: [n] int64, the InputBatch rows of plan.req_ids. Returns [n] int64
        drafts per row, aligned with plan.req_ids."""
        batch = self.batch
        num_drafts = np.zeros(len(rows), dtype=np.int64)
        index = {req_id: i for i, req_id in enumerate(plan.req_ids)}
        to_propose = []
        for req_id, drafts in plan.draft_token_ids.items():
            i = index[req_id]
            row = int(rows[i])
            assert batch.pending[row] < 0, f"{req_id}: drafts after a token being sampled"
            num_drafts[i] = len(drafts)
            if drafts[0] == PLACEHOLDER_TOKEN_ID:
                to_propose.append(i)
            else:
                batch.write_drafts(row, drafts)
        if to_propose:
            assert self.draft_proposer is not None, "-1 drafts but no draft model"
            idx = np.asarray(to_propose, dtype=np.int64)
            proposed = self.draft_proposer.propose(batch, rows[idx], num_drafts[idx],
                                                   [plan.req_ids[i] for i in to_propose])
            for i, drafts in zip(to_propose, proposed):
                batch.write_drafts(int(rows[i]), drafts)
        return num_drafts

    def verify_query_len(self, graph_runner: CUDAGraphRunner | None, num_drafts: np.ndarray,
                         q_lens: np.ndarray, ends: np.ndarray, n: int, width: int) -> int:
        """k + 1 when this step runs as a verification graph of `graph_runner` (every row a
        decode, 1 token and its drafts, some drafts, a captured batch size, room for the
        padded positions), else 0. Arrays [n] int64 as `ModelRunner.prepare` computed them
        (num_drafts: `write_drafts`'); width: the block tables' width."""
        runner = graph_runner
        if runner is None or not runner.verify_batch_sizes:
            return 0
        q = runner.verify_query_len
        if (not num_drafts.any() or not (q_lens == num_drafts + 1).all()
                or not runner.can_run(n, width, q)
                or (ends - q_lens + q).max() > self.batch.max_model_len):
            return 0
        return q

    # ----------------------------------------------------------------- launch
    def sample(self, plan: StepPlan, logits: torch.Tensor, sampled_rows: np.ndarray,
               num_drafts: np.ndarray, generator: torch.Generator,
               sample_plain: Callable[[torch.Tensor, np.ndarray], SamplerOutput | None],
               fork: Callable[[StepPlan, np.ndarray], tuple[list[int], np.ndarray]],
               ) -> tuple[SamplerOutput, np.ndarray, tuple[list[int], RejectionOutput]]:
        """Sample a step where some rows verify drafts.

        Args:
            logits: [sum(1 + num_drafts), V] on the device: 1 + num_drafts[i] rows per sampled
                row i, in order.
            sampled_rows: [num_sampled] int64 their InputBatch rows.
            num_drafts: [num_sampled] int64 drafts each verifies (0: a plain row).
            generator: the default generator (rows without a seed of their own).
            sample_plain: the plain sampler of rows in logits order (`ModelRunner._run_sampler`).
            fork: the rows of forked samples after their parents' (`ModelRunner._fork`).
        Returns:
            (the first new token of every output row, [num_out] int64 on the device, in row
             order with forked children after their parent; those rows, [num_out] int64;
             (the output positions of the rows that verified drafts, the rejection sampler's
             output for them)), for `ModelRunner._launch`.

        Rows without drafts (and forked children) go through the plain sampler, the others
        through the rejection sampler. The host's inputs (the drafts; the logits rows of each
        sampler and the merge order where they are not the identity) go to the device in one
        copy (`_to_device`). When every row verifies drafts (so no plain rows and no forks;
        batch-1 speculation always), the merged tokens are the verified rows' first tokens, a
        view; when every row also verifies the same number of drafts, `logits` is already
        [S, k + 1] in order and needs no gather either."""
        batch = self.batch
        device = logits.device
        assert not batch.is_beam[sampled_rows].any(), "a beam slot in a step with drafts"
        first = np.cumsum(num_drafts + 1) - (num_drafts + 1)  # first logits row of each
        is_spec = num_drafts > 0
        spec_rows = sampled_rows[is_spec]
        spec_drafts = num_drafts[is_spec]
        num_spec = len(spec_rows)
        all_spec = num_spec == len(sampled_rows)
        k = int(spec_drafts.max())
        t = np.arange(k + 1)
        # the drafts, from where `write_drafts` put them (past the row's tokens)
        cols = np.minimum(batch.num_tokens[spec_rows][:, None] + t[None, :k],
                          batch.max_model_len - 1)
        drafts = np.where(t[None, :k] < spec_drafts[:, None],
                          batch.token_ids[spec_rows[:, None], cols], 0).astype(np.int64)
        host_inputs = {"drafts": drafts.ravel()}  # [S * k]
        if not (all_spec and (spec_drafts == k).all()):
            # the logits rows of each verified row's k + 1 positions (a row with fewer drafts
            # repeats its last one)
            gather = first[is_spec][:, None] + np.minimum(t[None, :], spec_drafts[:, None])
            host_inputs["gather"] = gather.ravel()  # [S * (k + 1)]
        plain_rows = sampled_rows[~is_spec]
        order = None
        if all_spec:
            rows_out, spec_positions = sampled_rows, list(range(num_spec))
        else:
            plain_index = first[~is_spec]
            if plan.forks:
                index, plain_rows = fork(plan, plain_rows)
                plain_index = plain_index[index]
            order, rows_out, spec_positions = self._merge_order(plan, sampled_rows, is_spec,
                                                                plain_rows)
            host_inputs["plain"] = plain_index  # [num_plain] logits rows of the plain rows
            host_inputs["order"] = np.asarray(order, dtype=np.int64)  # [num_out]
        inputs = self._to_device(host_inputs, device)
        plain = None
        if len(plain_rows):
            plain = sample_plain(logits[inputs["plain"]], plain_rows)
        if "gather" in inputs:
            logits = logits[inputs["gather"]]
        spec_logits = logits.view(num_spec, k + 1, -1)
        states = batch.states
        verified = self.rejection_sampler(
            spec_logits, [states[r] for r in spec_rows.tolist()],
            inputs["drafts"].view(num_spec, k), spec_drafts.tolist(), generator)
        self._count_verified(spec_rows, verified, logits.shape[-1])
        first_tokens = verified.token_ids[:, 0]  # [S]
        first_logprobs = None if verified.logprobs is None else [
            None if lp is None else lp[0] for lp in verified.logprobs]
        if order is None:  # every row verified: the merge is the identity
            token_ids, logprobs = first_tokens, first_logprobs
        else:
            # plain outputs first, then the verified rows' first tokens, permuted into row
            # order with every forked child after its parent
            token_ids = torch.cat([plain.token_ids, first_tokens])[inputs["order"]]
            logprobs = None
            if plain.logprobs is not None or first_logprobs is not None:
                merged = (list(plain.logprobs) if plain.logprobs is not None
                          else [None] * len(plain_rows))
                merged += first_logprobs or [None] * num_spec
                logprobs = [merged[j] for j in order]
        output = SamplerOutput(token_ids=token_ids, logprobs=logprobs)
        return output, np.asarray(rows_out, dtype=np.int64), (spec_positions, verified)

    def _merge_order(self, plan: StepPlan, sampled_rows: np.ndarray, is_spec: np.ndarray,
                     plain_rows: np.ndarray) -> tuple[list[int], list[int], list[int]]:
        """Where each sampled row's first token lies in [plain outputs | verified rows' first
        tokens], in row order with every forked child after its parent: (that index per
        output row, the output rows, the output positions of the verified rows)."""
        batch = self.batch
        order, rows_out, spec_positions = [], [], []
        p = 0
        num_plain = len(plain_rows)
        for i, row in enumerate(sampled_rows.tolist()):
            if is_spec[i]:
                spec_positions.append(len(order))
                order.append(num_plain + len(spec_positions) - 1)
                rows_out.append(row)
                continue
            order.append(p)
            rows_out.append(int(plain_rows[p]))
            p += 1
            while p < num_plain and batch.states[int(plain_rows[p])].req_id in (
                    plan.forks.get(batch.states[row].req_id, ())):
                order.append(p)
                rows_out.append(int(plain_rows[p]))
                p += 1
        return order, rows_out, spec_positions

    def _to_device(self, host_inputs: dict[str, np.ndarray],
                   device: torch.device) -> dict[str, torch.Tensor]:
        """The int64 arrays of `host_inputs` on `device` in one copy (on CUDA through
        `_staging`, without waiting for the device). Returns a tensor per key, views of the
        one copy."""
        sizes = [len(v) for v in host_inputs.values()]
        flat = np.concatenate(list(host_inputs.values()))
        packed = (torch.from_numpy(flat) if device.type != "cuda"
                  else self._staging.to_device(flat, device))
        return dict(zip(host_inputs, torch.split(packed, sizes)))

    def _count_verified(self, spec_rows: np.ndarray, verified: RejectionOutput,
                        vocab_size: int) -> None:
        """Add the tokens of rows that verified drafts (accepted drafts and the target's
        token) to the penalty counts of those with penalties (on the device)."""
        sampling = self.batch.sampling
        penalized = np.flatnonzero(sampling.penalized[spec_rows])
        if not len(penalized):
            return
        sampling.flush(vocab_size)
        device = verified.token_ids.device
        index = to_device(np.concatenate(
            [penalized, sampling.penalty_slot[spec_rows[penalized]]]), device)
        pen_t, slots_t = index.split(len(penalized))
        tokens = verified.token_ids[pen_t]  # [p, K + 1]
        valid = (torch.arange(tokens.shape[1], device=device)[None, :]
                 < verified.num_tokens[pen_t, None])
        sampling.count(slots_t, tokens, valid)

    # ----------------------------------------------------------------- results
    def results(self, step: LaunchedStep, result: StepResult) -> None:
        """The further tokens of the rows of a fetched step (its event done) that verified
        drafts: into result.extra_token_ids (and extra_logprobs, for rows that asked), and
        into their rows, whose computed count moves back over the rejected drafts
        (`InputBatch.append_accepted`)."""
        positions, verified = step.spec
        host_tokens, host_counts = step.host_verified
        counts = host_counts.tolist()
        tokens = host_tokens.tolist()
        extras = []
        for s, i in enumerate(positions):
            req_id = step.req_ids[i]
            extra = result.extra_token_ids[req_id] = tokens[s][1: counts[s]]
            extras.append(extra)
            if verified.logprobs is not None and verified.logprobs[s] is not None:
                result.extra_logprobs[req_id] = verified.logprobs[s][1: counts[s]]
        idx = np.asarray(positions, dtype=np.int64)
        self.batch.append_accepted(step.rows[idx], step.epochs[idx], step.positions[idx], extras)
