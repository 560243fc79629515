"""Verification of draft tokens: which drafts the target model accepts, and its own next token.

For a sequence with drafts d_1..d_j after its last token x, the verification step computes
the target's logits at j + 1 positions: position t (0 <= t <= j) predicts the token after
x d_1..d_t. Each position's distribution p_t is the one the plain sampler would draw from there
(penalties, min_tokens and bad words see d_1..d_t as generated tokens; temperature, top-k,
top-p, min-p; pagedrt/engine/logits_processors.py).

Greedy rows accept the longest prefix of drafts equal to the target's argmaxes, then take the
argmax after it: exactly the tokens plain greedy decoding gives. When every row is greedy with
nothing that reads or changes the logits (no penalties, min_tokens or logprobs; the usual case
of n-gram speculation), a step takes a short path of five tensor ops: the argmax of the logits
in their own dtype (that of bf16/fp16 logits equals that of their float32 upcast, as in the
plain sampler), the drafts compared with it, the accepted count (cumprod, sum, + 1). Its
token_ids are the argmaxes themselves: an accepted draft equals the argmax at its position.

Sampled rows: rejection sampling (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling"), whose output tokens follow the target distribution
exactly. Our proposers are deterministic (n-gram lookup, a greedy draft model), so the draft
distribution q_t is one-hot at d_{t+1}, and the rule becomes:

    accept d_{t+1} with probability min(1, p_t(d_{t+1}) / q_t(d_{t+1})) = p_t(d_{t+1})
    on the first rejection, at t = a: draw from norm(max(0, p_a - q_a)), which is p_a with
        d_{a+1} removed and renormalized
    if all j are accepted: draw the bonus token from p_j

Noise: a seeded row's draws are those of its key at the positions of the tokens it verifies
(pagedrt/ops/philox.py): the race at position p draws what plain sampling draws there, and the
acceptance uniforms come from a stream of their own; other rows draw from the default
generator. Draws from a distribution are exponential races (argmax of p / Exp(1)), as in the
sampler: no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedrt.engine.bad_words import token_sequences
from pagedrt.engine.host_buffers import to_device
from pagedrt.engine.logits_processors import processed_logits, sampling_probs
from pagedrt.engine.sampler import (
    SamplingRow,
    TokenLogprobs,
    fill_seeded_draws_,
    gather_logprobs,
    plain_greedy,
    seeded_rows,
)
from pagedrt.ops.philox import STREAM_ACCEPT, STREAM_RACE


@dataclass
class RejectionOutput:
    """Attributes:
    token_ids: [S, K + 1] int64 on the logits' device: per row, its accepted drafts, then
        the target's token; entries past num_tokens are meaningless.
    num_tokens: [S] int64 on the logits' device: accepted drafts + 1.
    logprobs: per row, the TokenLogprobs of each of its K + 1 entries of token_ids (only the
        first num_tokens are meaningful), or None for a row that did not ask; None when no
        row asked.
    """

    token_ids: torch.Tensor
    num_tokens: torch.Tensor
    logprobs: list[list[TokenLogprobs] | None] | None = None


class RejectionSampler:
    """Stateless; one instance serves every step."""

    def __call__(
        self,
        logits: torch.Tensor,
        rows: list,
        draft_token_ids: torch.Tensor,
        num_drafts: list[int],
        default_generator: torch.Generator | None = None,
    ) -> RejectionOutput:
        """Verify every row's drafts (see the module docstring).

        Args:
            logits: [S, K + 1, vocab] float (any float dtype), the target's logits at each
                row's last token and after each of its drafts; positions past a row's
                num_drafts may hold anything finite.
            rows: S objects with the attributes of `SamplingRow` (params, seed,
                prompt_token_ids, output_token_ids, eos_token_ids).
            draft_token_ids: [S, K] int64 on the logits' device; entries past a row's
                num_drafts may hold any valid id.
            num_drafts: S ints in [0, K].
            default_generator: RNG of the rows without a seed; None: torch's global RNG.

        Returns:
            RejectionOutput.

        Raises:
            ValueError: shapes that do not match.
        """
        if logits.dim() != 3 or logits.shape[0] != len(rows) or len(num_drafts) != len(rows):
            raise ValueError(f"logits {tuple(logits.shape)}, {len(rows)} rows and "
                             f"{len(num_drafts)} draft counts do not match")
        num_rows, width, vocab_size = logits.shape
        k = width - 1
        if tuple(draft_token_ids.shape) != (num_rows, k):
            raise ValueError(f"draft_token_ids {tuple(draft_token_ids.shape)}, expected "
                             f"({num_rows}, {k})")
        if any(not 0 <= j <= k for j in num_drafts):
            raise ValueError(f"num_drafts {num_drafts} must lie in [0, {k}]")
        if all(plain_greedy(p) for p in {id(r.params): r.params for r in rows}.values()):
            return _verify_plain_greedy(logits, draft_token_ids, num_drafts)
        device = logits.device
        raw = logits.float().reshape(num_rows * width, vocab_size)
        position_rows = _position_rows(rows, draft_token_ids, num_drafts, width)
        processed = processed_logits(raw, position_rows)
        argmax = processed.argmax(dim=-1).view(num_rows, width)

        t = torch.arange(width, device=device)
        num_drafts_t = to_device(num_drafts, device, torch.int64)
        valid = t[None, :k] < num_drafts_t[:, None]  # [S, K] real drafts
        accept = draft_token_ids == argmax[:, :k]
        candidate = argmax
        greedy = [r.params.greedy for r in rows]
        if not all(greedy):
            sampled_accept, sampled_candidate = _sample(
                processed, position_rows, rows, draft_token_ids, num_drafts, valid,
                default_generator, width)
            is_greedy = to_device(greedy, device, torch.bool)[:, None]
            accept = torch.where(is_greedy, accept, sampled_accept)
            candidate = torch.where(is_greedy, candidate, sampled_candidate)
        accept &= valid
        num_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [S]
        drafts_wide = torch.cat([draft_token_ids, candidate[:, k:]], dim=1)  # [S, K + 1]
        token_ids = torch.where(t[None, :] < num_accepted[:, None], drafts_wide, candidate)
        output = RejectionOutput(token_ids=token_ids, num_tokens=num_accepted + 1)
        if any(r.params.logprobs is not None for r in rows):
            raw_logprobs = torch.log_softmax(raw, dim=-1)
            flat = gather_logprobs(raw_logprobs, token_ids.reshape(-1), position_rows)
            output.logprobs = [flat[s * width:(s + 1) * width]
                               if rows[s].params.logprobs is not None else None
                               for s in range(num_rows)]
        return output


def _verify_plain_greedy(logits: torch.Tensor, draft_token_ids: torch.Tensor,
                         num_drafts: list[int]) -> RejectionOutput:
    """`RejectionSampler.__call__` when every row is plain greedy (`plain_greedy`): the same
    accepted counts and the same tokens up to each row's num_tokens, in five tensor ops when
    every row has K drafts (else three more: a host mask of the real drafts, its copy and an
    and). No float32 copy of the logits: their argmax in bf16/fp16 is that of the upcast (the
    same values, the same first maximum). token_ids is the argmax at every position: where a
    draft is accepted it equals the argmax there, and the token after the accepted ones is
    the argmax."""
    argmax = logits.argmax(dim=-1)  # [S, K + 1]
    k = argmax.shape[1] - 1
    accept = draft_token_ids == argmax[:, :k]  # [S, K]
    if any(j < k for j in num_drafts):  # positions past a row's drafts accept nothing
        valid = [[t < j for t in range(k)] for j in num_drafts]
        accept &= to_device(valid, logits.device, torch.bool)
    num_tokens = accept.cumprod(dim=1).sum(dim=1) + 1  # [S]: accepted drafts + 1
    return RejectionOutput(token_ids=argmax, num_tokens=num_tokens)


def _position_rows(rows: list, draft_token_ids: torch.Tensor, num_drafts: list[int],
                   width: int) -> list:
    """One sampling row per position (S * (K + 1), row-major): position t of a row sees its
    drafts d_1..d_t as generated tokens, which the penalties, min_tokens and bad-word
    sequences read."""
    needs_history = any(r.params.reads_output_tokens or r.params.min_tokens
                        or token_sequences(r.params) for r in rows)
    if not needs_history:
        return [r for r in rows for _ in range(width)]
    drafts = draft_token_ids.tolist()
    out = []
    for r, row_drafts, j in zip(rows, drafts, num_drafts):
        outputs = list(r.output_token_ids)
        for t in range(width):
            out.append(SamplingRow(r.params, r.seed, r.prompt_token_ids,
                                   outputs + row_drafts[:min(t, j)], r.eos_token_ids,
                                   r.sample_index))
    return out


def _sample(processed: torch.Tensor, position_rows: list, rows: list,
            draft_token_ids: torch.Tensor, num_drafts: list[int], valid: torch.Tensor,
            default_generator: torch.Generator | None,
            width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Acceptance ([S, K] bool) and the token drawn at each position ([S, K + 1] int64: from
    p_t without d_{t+1} where a draft follows, else from p_t) for sampled rows."""
    num_rows, k = draft_token_ids.shape
    vocab_size = processed.shape[1]
    probs = sampling_probs(processed, position_rows).view(num_rows, width, vocab_size)
    uniform = torch.rand(num_rows, k, device=probs.device, generator=default_generator)
    race = torch.empty_like(probs).exponential_(generator=default_generator)
    seeded = seeded_rows(rows)  # their own draws, at the positions of the tokens they verify
    if len(seeded.index):
        offsets = np.arange(width, dtype=np.int64)
        fill_seeded_draws_(race, seeded, offsets, STREAM_RACE, exponential=True)
        fill_seeded_draws_(uniform.unsqueeze(2), seeded, offsets[:k], STREAM_ACCEPT,
                           exponential=False)
    draft_probs = probs[:, :k].gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)  # [S, K]
    accept = uniform < draft_probs
    # p_t with d_{t+1} removed where a real draft follows (the residual after a rejection)
    residual = probs.clone()
    keep = torch.where(valid, torch.zeros_like(draft_probs), draft_probs)
    residual[:, :k].scatter_(2, draft_token_ids.unsqueeze(2), keep.unsqueeze(2))
    race.clamp_(min=torch.finfo(race.dtype).tiny)  # 0 / 0 would be NaN, which argmax picks
    candidate = (residual / race).argmax(dim=-1)
    return accept, candidate
