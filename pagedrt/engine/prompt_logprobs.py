"""Prompt logprobs on the device side: the log-probability of each prompt token given the
tokens before it, for the requests that ask (`SamplingParams.prompt_logprobs`; docs/design.md,
"Request lifecycle").

The hidden state at position p gives the distribution of the token at p + 1, so a prefill
chunk of positions [start, end) of a P-token prompt holds the entries of prompt tokens
start + 1 .. min(end, P - 1): positions start .. min(end, P - 1) - 1. Position P - 1 (the last
prompt token) is the row that samples the first output token, as for any request; the prompt's
first token has no entry. The scheduler says which positions each step computes
(`StepPlan.prompt_logprobs`), so that a prompt recomputed after a preemption sends none twice.

Only those positions go through the LM head, apart from the sampled rows, in slices of at most
`MAX_ROWS_PER_SLICE` rows (a slice's float32 [rows, vocab] log-softmax is the largest tensor),
and the step's values stay on the device until `ModelRunner.fetch` reads them
(`PromptLogprobsLaunch.to_host`): no host sync at launch. Values are those of the raw model
distribution, as for sampled logprobs (pagedrt/engine/sampler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedrt.engine.sampler import TokenLogprobs

MAX_ROWS_PER_SLICE = 1024
"""Prompt positions per LM-head call: bounds the float32 [rows, vocab] logits and
log-softmax (1024 x 151,936 x 4 bytes = 622 MB each)."""


@dataclass
class PromptLogprobsInputs:
    """A step's prompt positions, from `plan_positions` (host) and on the device.

    Attributes:
        req_ids: the requests with positions this step, in row order.
        counts: [len(req_ids)] how many positions each has (consecutive, in order).
        num_top: [len(req_ids)] each one's `SamplingParams.prompt_logprobs`.
        hidden_index: [R] int64 on the device, R = sum(counts): the rows of the step's packed
            hidden states at those positions.
        targets: [R] int64 on the device: the prompt token each position predicts (the token
            at position + 1).
    """

    req_ids: list[str]
    counts: list[int]
    num_top: list[int]
    hidden_index: torch.Tensor
    targets: torch.Tensor


def plan_positions(ranges: dict[str, tuple[int, int]], req_ids: list[str], rows: np.ndarray,
                   starts: np.ndarray, cu: np.ndarray, token_ids: np.ndarray,
                   states: list) -> tuple[list[str], list[int], list[int], np.ndarray,
                                          np.ndarray]:
    """The host side of `PromptLogprobsInputs` for a plan (`ModelRunner.prepare`).

    Args:
        ranges: `StepPlan.prompt_logprobs`: req_id -> positions [a, b) of this step's chunk.
        req_ids, rows, starts: the plan's sequences, their InputBatch rows and first new
            positions ([n] int64), in row order.
        cu: [n + 1] int64 where each sequence's tokens start in the packed step.
        token_ids: the InputBatch's [rows, max_model_len] token ids.
        states: the InputBatch's `RowState`s (each row's params).
    Returns:
        (req_ids, counts, num_top, hidden_index [R] int64, targets [R] int64), row order.
    Raises:
        AssertionError: a range outside the sequence's chunk this step.
    """
    order = [i for i, rid in enumerate(req_ids) if rid in ranges]
    ids, counts, num_top, index, targets = [], [], [], [], []
    for i in order:
        rid, row = req_ids[i], int(rows[i])
        a, b = ranges[rid]
        start, num_new = int(starts[i]), int(cu[i + 1] - cu[i])
        assert start <= a < b <= start + num_new, (
            f"{rid}: prompt positions [{a}, {b}) outside its chunk [{start}, "
            f"{start + num_new})")
        ids.append(rid)
        counts.append(b - a)
        num_top.append(states[row].params.prompt_logprobs)
        index.append(np.arange(a, b, dtype=np.int64) - start + int(cu[i]))
        targets.append(token_ids[row, a + 1: b + 1].astype(np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return (ids, counts, num_top, np.concatenate(index) if index else empty,
            np.concatenate(targets) if targets else empty)


@dataclass
class PromptLogprobsLaunch:
    """A step's prompt logprobs on the device (valid once the step's work is done).

    Attributes:
        req_ids, counts, num_top: as in `PromptLogprobsInputs`.
        targets: [R] int64 the prompt tokens.
        logprobs: [R] float32 each one's log-probability.
        ranks: [R] int64 1 + the number of tokens with a strictly higher logprob.
        top_values, top_ids: [R, max(num_top)] float32 and int64, most likely first.
    """

    req_ids: list[str]
    counts: list[int]
    num_top: list[int]
    targets: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor
    top_values: torch.Tensor
    top_ids: torch.Tensor

    def to_host(self) -> dict[str, list[TokenLogprobs]]:
        """req_id -> one TokenLogprobs per position, in order: token_id the prompt token,
        its logprob and rank, top_logprobs the request's `prompt_logprobs` most likely
        (token_id, logprob). Waits for the device (the caller has: `ModelRunner.fetch`)."""
        targets, logprobs = self.targets.tolist(), self.logprobs.tolist()
        ranks, values, ids = self.ranks.tolist(), self.top_values.tolist(), self.top_ids.tolist()
        out: dict[str, list[TokenLogprobs]] = {}
        i = 0
        for rid, count, k in zip(self.req_ids, self.counts, self.num_top):
            out[rid] = [TokenLogprobs(targets[j], logprobs[j], ranks[j],
                                      list(zip(ids[j][:k], values[j][:k])))
                        for j in range(i, i + count)]
            i += count
        return out


def compute_prompt_logprobs(model, hidden: torch.Tensor,
                            inputs: PromptLogprobsInputs) -> PromptLogprobsLaunch:
    """Run the LM head over the prompt positions of `inputs` and reduce each row to what
    `PromptLogprobsLaunch` holds, slice by slice (`MAX_ROWS_PER_SLICE`); no host sync.

    Args:
        model: has `compute_logits(hidden [rows, hidden_size]) -> [rows, vocab]` (on every
            tensor-parallel rank alike: each calls it the same number of times).
        hidden: [num_tokens, hidden_size] the step's packed hidden states, before the final
            gather of the sampled rows; not modified.
        inputs: the positions.
    """
    num_top = max(inputs.num_top, default=0)
    logprobs, ranks, top_values, top_ids = [], [], [], []
    for s in range(0, len(inputs.targets), MAX_ROWS_PER_SLICE):
        index = inputs.hidden_index[s: s + MAX_ROWS_PER_SLICE]
        target = inputs.targets[s: s + MAX_ROWS_PER_SLICE, None]
        scores = torch.log_softmax(model.compute_logits(hidden[index]).float(), dim=-1)
        chosen = scores.gather(1, target)  # [rows, 1]
        logprobs.append(chosen.squeeze(1))
        ranks.append((scores > chosen).sum(dim=-1) + 1)
        values, ids = scores.topk(num_top, dim=-1)
        top_values.append(values)
        top_ids.append(ids)
    return PromptLogprobsLaunch(inputs.req_ids, inputs.counts, inputs.num_top, inputs.targets,
                                torch.cat(logprobs), torch.cat(ranks), torch.cat(top_values),
                                torch.cat(top_ids))
