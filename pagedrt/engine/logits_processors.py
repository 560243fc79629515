"""Logits processors: what shapes a row's next-token distribution before the sampler
(pagedrt/engine/sampler.py) chooses a token from it.

Order of operations (vLLM v1's default, which matches HF transformers where both define it):

    raw logits --log_softmax--> logprobs (returned; the model's own distribution)
        |
        +-- logit_bias added; tokens outside allowed_token_ids and single-token bad words
        |   set to -inf (one additive row per request, pagedrt/engine/logit_bias.py)
        +-- bad words of several tokens: the last token set to -inf where the generated
        |   tokens end with the others (pagedrt/engine/bad_words.py)
        +-- penalties: repetition (prompt + output), frequency and presence (output only)
        +-- min_tokens: EOS / stop_token_ids set to -inf while too few tokens were generated
        |
        +-- greedy rows (temperature 0): argmax
        +-- other rows: / temperature -> top_k -> top_p -> min_p -> softmax -> exponential race

The logprobs, the argmax and the exponential race are the sampler's; the steps between are
here.

The reference (torch) path builds each row's settings from a list of rows (objects with the
attributes of `SamplingRow`) on every call: `processed_logits` (logit_bias,
allowed_token_ids and bad words, penalties, then min_tokens: the logits a greedy row takes the
argmax of)
and `sampling_probs` (temperature, top-k, top-p, min-p, softmax: the distribution a sampled
row draws from). `Sampler.__call__` and the
rejection sampler (pagedrt/spec/rejection_sampler.py) use them. The batched
`Sampler.sample_rows` reads the settings from `SamplingState` (pagedrt/engine/
sampling_state.py) as tensors instead and calls the same building blocks itself: `penalize`,
`apply_top_k_top_p` (or `prefix_filters` on each row's top-k candidates) and `apply_min_p`,
with the softmax and the race, or on CUDA the Triton race, after them; tests/
test_sampler_batched.py checks that both paths give the same tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedrt.engine.bad_words import banned_after, token_sequences
from pagedrt.engine.host_buffers import to_device
from pagedrt.engine.logit_bias import additive_rows, has_additive_row

if TYPE_CHECKING:
    from pagedrt.engine.sampler import SamplingRow


def processed_logits(raw: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """logit_bias, allowed_token_ids and bad words, penalties, then min_tokens: the logits a
    greedy row takes the argmax of.

    Args:
        raw: [B, vocab] float32, not modified (a new tensor is returned where a row changes).
    """
    logits = _apply_logit_bias(raw, rows)  # a new tensor if any row has an additive row
    logits = _apply_bad_word_sequences(logits, rows, raw)
    logits = _apply_penalties(logits, rows)  # a new tensor if any row has penalties
    return _apply_min_tokens(logits, rows, raw)


def _apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Each row with logit_bias, allowed_token_ids or a single-token bad word plus its additive
    row (`logit_bias.additive_rows`, built here on every call).

    Args:
        logits: [B, vocab] float32. Returns a new tensor when any row has one, else logits.
    """
    idx = [i for i, r in enumerate(rows) if has_additive_row(r.params)]
    if not idx:
        return logits
    index = to_device(idx, logits.device, torch.int64)
    adjusted = logits.clone()
    adjusted[index] = logits[index] + additive_rows([rows[i].params for i in idx],
                                                    logits.shape[1], logits.device)
    return adjusted


def _apply_bad_word_sequences(logits: torch.Tensor, rows: list[SamplingRow],
                              raw: torch.Tensor) -> torch.Tensor:
    """The last token of each bad-word sequence (two tokens or more) whose other tokens end a
    row's generated tokens (`bad_words.banned_after`, on the host) set to -inf.

    Args:
        logits: [B, vocab] float32; a copy is made first where it is `raw` and a row bans.
    """
    index, tokens = [], []
    for i, r in enumerate(rows):
        sequences = token_sequences(r.params)
        if sequences:
            banned = banned_after(sequences, r.output_token_ids)
            index += [i] * len(banned)
            tokens += banned
    return _minus_inf_at(logits, raw, index, tokens)


def sampling_probs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The distribution a sampled row draws from: `processed_logits` / temperature, then
    top-k, top-p and min-p, then softmax. Greedy rows get temperature 1 (their probabilities
    are not used). Returns [B, vocab] float32.

    Args:
        logits: [B, vocab] float32 from `processed_logits`.
    """
    vocab_size, device = logits.shape[1], logits.device
    params = [r.params for r in rows]
    temperature = to_device([p.temperature if not p.greedy else 1.0 for p in params], device,
                            torch.float32)
    logits = logits / temperature.unsqueeze(1)

    top_ks = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
    top_ps = [p.top_p for p in params]
    if any(k < vocab_size for k in top_ks) or any(p < 1.0 for p in top_ps):
        logits = apply_top_k_top_p(logits, to_device(top_ks, device, torch.int64).unsqueeze(1),
                                   to_device(top_ps, device, torch.float32).unsqueeze(1),
                                   top_ks, top_ps)
    if any(p.min_p > 0.0 for p in params):
        min_ps = to_device([p.min_p for p in params], device, torch.float32)
        logits = apply_min_p(logits, min_ps.unsqueeze(1))
    return torch.softmax(logits, dim=-1)


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Repetition penalty (Keskar et al. 2019, CTRL; as HF's RepetitionPenaltyLogitsProcessor):
    a logit of a token seen in prompt or output is divided by the penalty when positive and
    multiplied when negative. Then, OpenAI API style, on output tokens only:
    ``logit -= frequency_penalty * count + presence_penalty * (count > 0)``.

    Args:
        logits: [B, vocab] float32. Returns a new tensor when any row is penalized, else logits.
    """
    idx = [
        i
        for i, r in enumerate(rows)
        if r.params.repetition_penalty != 1.0
        or r.params.frequency_penalty != 0.0
        or r.params.presence_penalty != 0.0
    ]
    if not idx:
        return logits
    device, vocab_size = logits.device, logits.shape[1]
    sub = [rows[i] for i in idx]
    output_counts = _token_counts([r.output_token_ids for r in sub], vocab_size, device)
    prompt_counts = _token_counts([r.prompt_token_ids for r in sub], vocab_size, device)
    rep = to_device([r.params.repetition_penalty for r in sub], device,
                    torch.float32).unsqueeze(1)
    freq = to_device([r.params.frequency_penalty for r in sub], device,
                     torch.float32).unsqueeze(1)
    pres = to_device([r.params.presence_penalty for r in sub], device,
                     torch.float32).unsqueeze(1)

    index = to_device(idx, device, torch.int64)
    logits = logits.clone()
    logits[index] = penalize(logits[index], output_counts, prompt_counts > 0, rep, freq, pres)
    return logits


def penalize(x: torch.Tensor, output_counts: torch.Tensor, prompt_seen: torch.Tensor,
             rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor) -> torch.Tensor:
    """The penalties of `_apply_penalties` on the rows that have them.

    Args:
        x: [n, vocab] float32 logits. output_counts: [n, vocab] float32. prompt_seen:
            [n, vocab] bool. rep, freq, pres: [n, 1] float32. All on one device.
    Returns a new [n, vocab] float32 tensor.
    """
    seen = (output_counts > 0) | prompt_seen
    penalty = torch.where(seen, rep, torch.ones_like(x))
    x = torch.where(x > 0, x / penalty, x * penalty)
    return x - freq * output_counts - pres * (output_counts > 0).float()


def _token_counts(token_id_lists: list, vocab_size: int, device: torch.device) -> torch.Tensor:
    """[n, vocab] float32 count of each token id per list (padding goes to a dropped column)."""
    width = max((len(t) for t in token_id_lists), default=0)
    padded = torch.full((len(token_id_lists), max(width, 1)), vocab_size, dtype=torch.int64)
    for i, ids in enumerate(token_id_lists):
        padded[i, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.int64)
    counts = torch.zeros(len(token_id_lists), vocab_size + 1, device=device)
    index = to_device(padded, device, torch.int64)
    counts.scatter_add_(1, index, torch.ones(index.shape, device=device))
    return counts[:, :vocab_size]


def _apply_min_tokens(
    logits: torch.Tensor, rows: list[SamplingRow], raw: torch.Tensor
) -> torch.Tensor:
    """Set EOS (unless ignore_eos) and stop_token_ids to -inf for rows with too few outputs."""
    row_idx, tok_idx = [], []
    vocab_size = logits.shape[1]
    for i, r in enumerate(rows):
        # min_tokens first: a row's output_token_ids may be built on each read
        if not r.params.min_tokens or len(r.output_token_ids) >= r.params.min_tokens:
            continue
        stop_ids = set(r.params.stop_token_ids)
        if not r.params.ignore_eos:
            stop_ids.update(r.eos_token_ids)
        for t in stop_ids:
            if t < vocab_size:
                row_idx.append(i)
                tok_idx.append(t)
    return _minus_inf_at(logits, raw, row_idx, tok_idx)


def _minus_inf_at(logits: torch.Tensor, raw: torch.Tensor, row_idx: list[int],
                  tok_idx: list[int]) -> torch.Tensor:
    """`logits` with each (row_idx[i], tok_idx[i]) set to -inf, by one index copy and one
    index_put; copied first where it is `raw` (the caller's unprocessed logits); `logits`
    itself where there is no pair."""
    if not row_idx:
        return logits
    logits = logits.clone() if logits is raw else logits
    index = to_device([row_idx, tok_idx], logits.device, torch.int64)
    logits[index[0], index[1]] = float("-inf")
    return logits


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor,
                      host_k: np.ndarray, host_p: np.ndarray) -> torch.Tensor:
    """Top-k, then top-p (nucleus; Holtzman et al. 2019), over the rows of a batch.

    Top-k keeps a row's k largest logits (exactly k tokens; among equal values at the k-th
    place, the order of the sort or selection decides). Top-p keeps the smallest prefix of the
    descending, renormalized distribution (after top-k) whose mass reaches p, and always the
    top token. Rows with k = vocab and p = 1 are returned unchanged.

    Rows with a top-k take their k_max = max k candidates from `topk` (a selection: the
    [B, vocab] sort of every row costs far more at a vocabulary of 150k); both filters then
    act on those k_max sorted values, which is exact because top-p after top-k only ever looks
    at the first k. Rows with top-p alone need the whole sorted row (their nucleus can reach
    any length): they are sorted, alone (`_top_k_top_p_sorted`). So is every row when k_max
    is more than a quarter of the vocabulary. The path is picked from host_k and host_p, so
    nothing waits for the device.

    Args:
        logits: [B, vocab] float32 (already divided by temperature). Returns a new tensor.
        k: [B, 1] int64 on the logits' device, in [1, vocab] (vocab: no top-k).
        p: [B, 1] float32 on the logits' device, in (0, 1] (1: no top-p).
        host_k, host_p: [B] the same values on the host (numpy).
    """
    vocab_size = logits.shape[1]
    host_k, host_p = np.asarray(host_k), np.asarray(host_p)
    has_k = host_k < vocab_size
    p_alone = ~has_k & (host_p < 1.0)
    k_max = int(host_k[has_k].max()) if has_k.any() else 0
    if p_alone.all() or k_max > vocab_size // 4:
        return _top_k_top_p_sorted(logits, k, p)
    out = _top_k_top_p_candidates(logits, k, p, k_max) if k_max else logits.clone()
    if p_alone.any():
        idx = to_device(np.flatnonzero(p_alone), logits.device, torch.int64)
        out[idx] = _top_k_top_p_sorted(logits[idx], k[idx], p[idx])
    return out


def _top_k_top_p_candidates(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor,
                            k_max: int) -> torch.Tensor:
    """`apply_top_k_top_p` for rows with k <= k_max: both filters on each row's k_max largest
    logits (`topk`, descending), scattered back into a row of -inf. Rows with k = vocab are
    returned whole (the caller sorts those that have a top-p)."""
    values, order = logits.topk(k_max, dim=-1)  # [B, k_max] each, descending
    values = prefix_filters(values, k, p)
    out = torch.full_like(logits, float("-inf")).scatter_(1, order, values)
    return torch.where(k >= logits.shape[1], logits, out)


def _top_k_top_p_sorted(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`apply_top_k_top_p` with one descending sort of every row (any k and p)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, vocab] each
    sorted_logits = prefix_filters(sorted_logits, k, p)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def prefix_filters(values: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Top-k and top-p on rows of logits sorted descending ([B, n]): -inf from position k on,
    then past the smallest prefix whose renormalized mass reaches p (the first kept always;
    nothing past top-k when p = 1, where a float32 prefix sum can reach 1 before the end)."""
    positions = torch.arange(values.shape[1], device=values.device).unsqueeze(0)  # [1, n]
    values = values.masked_fill(positions >= k, float("-inf"))
    probs = torch.softmax(values, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # exclusive prefix sum
    drop = (mass_before >= p) & (positions > 0) & (p < 1.0)
    return values.masked_fill(drop, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Min-p (Nguyen et al. 2024): drop tokens with probability < min_p * the top probability.

    Compared in log space: logit < max_logit + log(min_p). Rows with min_p = 0 keep everything.
    min_p: [B, 1] float32 on the logits' device.
    """
    threshold = logits.max(dim=-1, keepdim=True).values + torch.log(min_p)  # log(0) = -inf
    return logits.masked_fill(logits < threshold, float("-inf"))
