"""Sampler: turn a batch of next-token logits into tokens, one `SamplingParams` per row.

The logits first go through the logits processors (pagedrt/engine/logits_processors.py, which
gives the order of operations): logit_bias, allowed_token_ids and bad words, penalties and
min_tokens on every row; then greedy rows (temperature 0) take the argmax, and other rows draw
by the exponential race below from softmax(logits / temperature) after top_k, top_p and min_p.

Logprobs are those of the raw logits, before logit_bias, allowed_token_ids, bad words,
penalties and temperature (vLLM's default ``logprobs_mode="raw_logprobs"``): they describe the
model, not the sampling settings (a token that allowed_token_ids or a bias made certain still
reports the model's own log-probability).

Reproducibility: a seeded row's noise is a function of its key (its request's seed plus its
sample index: sample i of seed s draws what a request with seed s + i draws alone) and the
position of the token it samples, drawn with a counter-based generator
(pagedrt/ops/philox.py): its tokens depend neither on the batch it runs in nor on preemptions,
and every seeded row of a batch is drawn by one launch. Other rows draw from the default
generator, one draw for the whole batch. Sampling by "exponential race" (argmax of p_i / q_i
with q_i ~ Exp(1) picks i with probability p_i) needs no host sync, unlike
`torch.multinomial`. On CUDA, `sample_rows` runs the race (and the temperature, when no
top-k/top-p/min-p is set) in one Triton kernel over the logits and the same noise
(pagedrt/ops/sample_triton.py).

The hot path (no penalties, no logprobs, no min_tokens, no logit_bias, allowed_token_ids or bad
words) has no host sync: per-row parameters are built from Python values once per call and
copied to the device from pinned memory, non-blocking. `sample_rows` reads nothing of
logit_bias, allowed_token_ids and bad words while no row of the batch has them
(`AdditiveRows.num_rows`, `BadWordSequences.num_rows`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from pagedrt.engine.bad_words import OutputHistory, apply_sequence_bans
from pagedrt.engine.host_buffers import to_device
from pagedrt.engine.logits_processors import (
    apply_min_p,
    apply_top_k_top_p,
    penalize,
    prefix_filters,
    processed_logits,
    sampling_probs,
)
from pagedrt.engine.sampling_state import (
    FREQUENCY,
    GREEDY,
    MIN_P,
    PRESENCE,
    REPETITION,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    SamplingState,
    seed_key,
)
from pagedrt.env_flags import env_flag
from pagedrt.ops.philox import STREAM_RACE, fill_counter_draws_
from pagedrt.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """What the sampler needs to know about one row of the logits batch (any object with
    these attributes will do; the model runner passes the `RowState`s of its rows,
    pagedrt/engine/input_batch.py, docs/design.md).

    Attributes:
        params: the request's sampling settings.
        seed: the request's seed (params.seed), or None: the row draws from the default
            generator passed to `Sampler.__call__`.
        prompt_token_ids: the prompt (repetition penalty; with the output, the position of
            the token sampled, which a seeded row's draws depend on).
        output_token_ids: tokens generated so far (penalties, min_tokens).
        eos_token_ids: the model's EOS ids; suppressed while fewer than `min_tokens` tokens were
            generated, unless `ignore_eos` (then EOS is no stop token, as in vLLM).
        sample_index: which of the request's n samples the row is (a seeded row's key is
            `seed_key(seed, sample_index)`).
    """

    params: SamplingParams
    seed: int | None = None
    prompt_token_ids: list[int] | tuple[int, ...] = ()
    output_token_ids: list[int] | tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    sample_index: int = 0


class TokenLogprobs(NamedTuple):
    """Logprobs of one step of one request.

    Attributes:
        token_id: the sampled token.
        logprob: its log-probability under the raw model distribution.
        rank: 1 + the number of tokens with a strictly higher logprob.
        top_logprobs: the `params.logprobs` most likely (token_id, logprob), most likely first.
    """

    token_id: int
    logprob: float
    rank: int
    top_logprobs: list[tuple[int, float]]


@dataclass
class SamplerOutput:
    """Attributes:
    token_ids: [B] int64 on the logits' device.
    logprobs: one entry per row (None for rows that did not ask); None when no row asked.
    """

    token_ids: torch.Tensor
    logprobs: list[TokenLogprobs | None] | None = None


class Sampler:
    """Stateless but for its choice of kernel; one instance serves every step.

    Args:
        kernel: whether `sample_rows` draws its tokens with the Triton race
            (pagedrt/ops/sample_triton.py) instead of softmax, clamp, division and argmax in
            torch ops: None (the default) for CUDA logits when Triton is importable, unless
            the environment variable PAGEDRT_SAMPLE_KERNEL is 0 (never) or 1 (also on CPU
            tensors, under TRITON_INTERPRET=1: the tests); True or False decides alone.

    Attributes:
        split: where the kernel is used, the race splits each row's vocabulary over several
            programs, and a batch of greedy rows takes the same kernel's argmax
            (`sample_triton.argmax_triton`) instead of torch.argmax (pagedrt/ops/
            sample_triton.py, "Split rows"): on by default, PAGEDRT_SAMPLE_SPLIT=0 turns it
            off (docs/design.md, "Seeded sampling", "Rows split over programs").
    """

    def __init__(self, kernel: bool | None = None) -> None:
        self.kernel = kernel
        self.split = env_flag("PAGEDRT_SAMPLE_SPLIT")
        if kernel is None:
            self.kernel = env_flag("PAGEDRT_SAMPLE_KERNEL")

    def check_device(self, device: torch.device) -> None:
        """Raises ValueError where the kernel is forced (PAGEDRT_SAMPLE_KERNEL=1 or
        kernel=True) for CPU tensors outside Triton's interpreter, which is the only way
        Triton runs on a CPU: said at start-up, not at the first sampled token."""
        if (self.kernel and torch.device(device).type == "cpu"
                and os.environ.get("TRITON_INTERPRET") != "1"):
            raise ValueError("PAGEDRT_SAMPLE_KERNEL=1 on a CPU device needs TRITON_INTERPRET=1 "
                             "(Triton's interpreter, the tests' setting); set it too, or unset "
                             "PAGEDRT_SAMPLE_KERNEL to sample with torch ops")

    def warm_up(self, logits: torch.Tensor) -> None:
        """Launch once each Triton kernel form `sample_rows` may take on logits like these
        (the race over a noise tensor; with `split`, the race and the greedy argmax in spans
        too), so that no request's step compiles or loads one: a first compile costs about a
        second. A no-op where the kernel is not used.

        Args:
            logits: [B, vocab] in the model's dtype on the engine's device (zeros will do);
                not modified.
        """
        if not self._use_kernel(logits) or logits.stride(1) != 1 or not len(logits):
            return
        from pagedrt.ops.sample_triton import (
            argmax_triton,
            race_argmax_triton,
            sample_splits,
        )
        from pagedrt.ops.triton_utils import device_sms

        num_rows, device = logits.shape[0], logits.device
        ones = torch.ones(num_rows, dtype=torch.float32, device=device)
        for splits in {1, sample_splits(*logits.shape, device_sms(logits)) if self.split else 1}:
            race_argmax_triton(logits, torch.ones(logits.shape, device=device), ones, ones * 0,
                               splits)
            if self.split:
                argmax_triton(logits, splits)

    def _use_split_argmax(self, logits: torch.Tensor) -> bool:
        """Whether a batch of greedy rows takes `sample_triton.argmax_triton`."""
        return self.split and logits.stride(1) == 1 and self._use_kernel(logits)

    def _use_kernel(self, logits: torch.Tensor) -> bool:
        if self.kernel is not None:
            return self.kernel
        from pagedrt.ops.attention import triton_available

        return logits.is_cuda and triton_available()

    def __call__(
        self,
        logits: torch.Tensor,
        rows: list[SamplingRow],
        default_generator: torch.Generator | None = None,
    ) -> SamplerOutput:
        """Pick one token per row.

        Args:
            logits: [B, vocab] float (any float dtype; computed in float32), any device. Not
                modified.
            rows: B entries, one per logits row.
            default_generator: RNG of the rows without a seed; None means torch's global RNG.

        Returns:
            SamplerOutput with token_ids [B] int64 on logits.device.
        """
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(rows)} rows")
        distinct_params = {id(r.params): r.params for r in rows}.values()  # often just one
        if all(plain_greedy(p) for p in distinct_params):
            # argmax of bf16/fp16 logits equals that of their exact float32 upcast
            return SamplerOutput(token_ids=logits.argmax(dim=-1))
        raw = logits.float()
        device = raw.device

        want_logprobs = any(r.params.logprobs is not None for r in rows)
        raw_logprobs = torch.log_softmax(raw, dim=-1) if want_logprobs else None

        logits = processed_logits(raw, rows)

        greedy = [r.params.greedy for r in rows]
        if all(greedy):
            token_ids = logits.argmax(dim=-1)
        else:
            sampled = self._sample(logits, rows, default_generator)
            if any(greedy):
                is_greedy = to_device(greedy, device, torch.bool)
                token_ids = torch.where(is_greedy, logits.argmax(dim=-1), sampled)
            else:
                token_ids = sampled

        output = SamplerOutput(token_ids=token_ids)
        if raw_logprobs is not None:
            output.logprobs = _gather_logprobs(raw_logprobs, token_ids, rows)
        return output

    @staticmethod
    def _sample(
        logits: torch.Tensor, rows: list[SamplingRow], default_generator: torch.Generator | None
    ) -> torch.Tensor:
        """Temperature, top-k, top-p, min-p, then the exponential race. Returns [B] int64.

        Greedy rows are sampled too (at temperature 1) and overwritten by the caller; they draw
        noise from the default generator only, never from their seeded key.
        """
        probs = sampling_probs(logits, rows)
        return _exponential_race(probs, seeded_rows(rows), default_generator)

    def sample_rows(
        self,
        logits: torch.Tensor,
        state: SamplingState,
        rows: np.ndarray,
        row_states: list,
        num_tokens: np.ndarray,
        default_generator: torch.Generator | None = None,
        out: torch.Tensor | None = None,
        history: OutputHistory | None = None,
    ) -> SamplerOutput:
        """`__call__` for rows of the device side's persistent batch: the same tokens (the same
        ops on the same values, the same draws), with each row's settings read from `state`
        (pagedrt/engine/sampling_state.py) by tensor ops instead of built per request. Python
        runs per row only for the logprobs of rows that ask for them. Rows with penalties add
        their sampled token to their counts on the device. Rows with logit_bias,
        allowed_token_ids or a single-token bad word add their additive row (`state.bias`,
        pagedrt/engine/logit_bias.py) to their logits first, by one gather, one add and one
        index_put over those rows; rows with bad-word sequences of several tokens then get
        the step's matches (`state.bad_words.bans`, on the host) set to -inf by one index_put
        (pagedrt/engine/bad_words.py).

        Args:
            logits: [B, vocab] float (any float dtype), any device. Not modified.
            state: the rows' settings (the InputBatch's `sampling`).
            rows: [B] int64 the rows, in logits order.
            row_states: per row (indexed by row), an object with `params` (the InputBatch's
                `states`); read only for the logprobs.
            num_tokens: per row (indexed by row), its number of tokens (min_tokens; the
                position of the token sampled, for seeded rows' draws).
            default_generator: RNG of the rows without a seed; None means torch's global RNG.
            out: [B] int64 on logits.device, or None: where a batch of plain greedy rows
                writes its tokens (the graph runner's `last_tokens`, which the next decode
                graph reads: no copy there); other batches ignore it.
            history: the rows' generated tokens, which bad-word sequences are matched
                against; needed while some row has such sequences
                (`state.bad_words.num_rows`), else None.

        Raises:
            ValueError: logits that do not match `rows`, or rows with bad-word sequences and
                no `history`.

        Returns:
            SamplerOutput with token_ids [B] int64 on logits.device (`out` itself where it
            was written).
        """
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(rows)} rows")
        if state.plain_greedy[rows].all():
            if self._use_split_argmax(logits):
                return SamplerOutput(token_ids=_split_argmax(logits, out))
            if out is not None:
                return SamplerOutput(token_ids=torch.argmax(logits, dim=-1, out=out))
            return SamplerOutput(token_ids=logits.argmax(dim=-1))
        vocab_size, device = logits.shape[1], logits.device
        state.flush(vocab_size)
        want_logprobs = bool(state.wants_logprobs[rows].any())

        # every index the step needs, in one copy: [rows | biased i | their slots | penalized
        # i | their slots | min_tokens (i, token) pairs | bad-word bans (i, token, need, src)],
        # each part after rows only where some row has it
        biased = bias_slots = _NO_ROWS  # (no indexing at all while no row has a bias)
        if state.bias.num_rows:
            biased = np.flatnonzero(state.bias.slot[rows] >= 0)
            bias_slots = state.bias.slot[rows[biased]]
        bans = None  # (nothing read while no row has bad-word sequences)
        if state.bad_words.num_rows:
            if history is None:
                raise ValueError("rows with bad-word sequences need the history of their "
                                 "generated tokens: pass `history`")
            bans = state.bad_words.bans(rows, num_tokens, state.prompt_len, history)
            if not len(bans.index):
                bans = None
        penalized = np.flatnonzero(state.penalized[rows])
        slots = state.penalty_slot[rows[penalized]]
        blocked = np.flatnonzero(
            state.min_tokens[rows] > num_tokens[rows] - state.prompt_len[rows])
        stop = state.stop_ids[rows[blocked]]  # [m, S], -1 pads
        pair_i, pair_j = np.nonzero((stop >= 0) & (stop < vocab_size))
        use_kernel = self._use_kernel(logits)
        # the kernel reads 16-bit logits as they are (its float32 values are theirs); the
        # torch ops, penalties, min_tokens and logprobs work on a float32 copy
        raw = logits if (use_kernel and logits.stride(1) == 1 and not want_logprobs
                         and not len(penalized) and not len(pair_i) and not len(biased)
                         and bans is None) else logits.float()
        raw_logprobs = torch.log_softmax(raw, dim=-1) if want_logprobs else None
        # the parts no row needs are left out: each part split off is a tensor view, a few
        # microseconds of host time per step
        parts = [rows]
        if len(biased):
            parts += [biased, bias_slots]
        if len(penalized):
            parts += [penalized, slots]
        if len(pair_i):
            parts += [blocked[pair_i], stop[pair_i, pair_j]]
        conditional = bans is not None and bool((bans.need >= 0).any())
        if bans is not None:
            parts += [bans.index, bans.token] + ([bans.need, bans.src] if conditional else [])
        index = to_device(np.concatenate(parts), device)
        rows_t, *taken = (index,) if len(parts) == 1 else torch.split(
            index, [len(part) for part in parts])
        take = iter(taken)
        bias_t, bias_slots_t = (next(take), next(take)) if len(biased) else (None, None)
        pen_t, slots_t = (next(take), next(take)) if len(penalized) else (None, None)
        block_i, block_t = (next(take), next(take)) if len(pair_i) else (None, None)
        ban_t = list(take)
        params = state.device_params()[rows_t]  # [B, NUM_PARAMS]

        logits = raw
        if len(biased):
            logits = raw.clone()
            logits[bias_t] = raw[bias_t] + state.bias.table[bias_slots_t]
        if bans is not None:
            logits = logits.clone() if logits is raw else logits
            need_t, src_t = (ban_t[2], ban_t[3]) if conditional else (None, None)
            apply_sequence_bans(logits, ban_t[0], ban_t[1], need_t, src_t,
                                history.pending_tokens)
        if len(penalized):
            x = penalize(logits[pen_t], state.output_counts[slots_t].float(),
                         state.prompt_seen[slots_t], params[pen_t, REPETITION, None],
                         params[pen_t, FREQUENCY, None], params[pen_t, PRESENCE, None])
            logits = logits.clone() if logits is raw else logits
            logits[pen_t] = x
        if len(pair_i):
            logits = logits.clone() if logits is raw else logits
            logits[block_i, block_t] = float("-inf")

        greedy = state.greedy[rows]
        top_k = state.top_k[rows]
        top_kp = bool(((top_k > 0) & (top_k < vocab_size)).any()
                      or (state.params[rows, TOP_P] < 1.0).any())
        min_p = bool((state.params[rows, MIN_P] > 0.0).any())
        if greedy.all():
            token_ids = (_split_argmax(logits) if self._use_split_argmax(logits)
                         else logits.argmax(dim=-1))
        elif use_kernel and not (top_kp or min_p):  # temperature and the race in one pass
            token_ids = _race(logits, params[:, TEMPERATURE], params[:, GREEDY],
                              _seeded(state, rows, num_tokens), default_generator, self.split)
        else:
            sampled = _sample_filtered(logits, params, top_k, state.params[rows, TOP_P], greedy,
                                       top_kp, min_p, _seeded(state, rows, num_tokens),
                                       use_kernel, default_generator, self.split)
            if greedy.any():
                token_ids = torch.where(params[:, GREEDY] > 0, logits.argmax(dim=-1), sampled)
            else:
                token_ids = sampled

        if len(penalized):
            state.count(slots_t, token_ids[pen_t])
        output = SamplerOutput(token_ids=token_ids)
        if raw_logprobs is not None:
            output.logprobs = _gather_logprobs(raw_logprobs, token_ids,
                                               [row_states[r] for r in rows.tolist()])
        return output


def _sample_filtered(logits: torch.Tensor, params: torch.Tensor, host_k: np.ndarray,
                     host_p: np.ndarray, host_greedy: np.ndarray, top_kp: bool, min_p: bool,
                     seeded: SeededRows | None, use_kernel: bool,
                     default_generator: torch.Generator | None,
                     split: bool = False) -> torch.Tensor:
    """`sample_rows`' draw for rows with top-k, top-p or min-p: temperature, the filters, then
    the exponential race; greedy rows are drawn too (the caller overwrites them).

    When every sampled row has a top-k of at most a quarter of the vocabulary, only the k_max
    largest logits of a row can be drawn, so everything after the selection runs on those
    [B, k_max] candidates (`_sample_candidates`) instead of on [B, vocab] tensors: the same
    values, filters and noise, so the same tokens as the full rows (`__call__`, the
    reference) up to the float32 rounding of the softmax's normalizer. Otherwise the full
    rows: temperature, `apply_top_k_top_p`, `apply_min_p`, then the race.

    Args:
        logits: [B, vocab] (after penalties and min_tokens), not modified.
        params: [B, NUM_PARAMS] float32 on the logits' device (`SamplingState.device_params`).
        host_k, host_p, host_greedy: [B] the rows' top-k (0: none), top-p and greedy flag on
            the host; they pick the path, so nothing waits for the device.
        top_kp, min_p: whether any row has a top-k or top-p, a min-p.
    Returns:
        [B] int64 token ids.
    """
    vocab_size = logits.shape[1]
    host_k = np.where((host_k > 0) & (host_k < vocab_size), host_k, vocab_size)
    k = params[:, TOP_K, None].long()
    k = torch.where((k > 0) & (k < vocab_size), k, vocab_size)
    temperature, top_p = params[:, TEMPERATURE, None], params[:, TOP_P, None]
    min_p_t = params[:, MIN_P, None] if min_p else None
    sampled_k = host_k[~host_greedy]
    k_max = int(host_k[host_k < vocab_size].max(initial=0))
    if len(sampled_k) and (sampled_k < vocab_size).all() and k_max <= vocab_size // 4:
        return _sample_candidates(logits, k_max, temperature, k, top_p, min_p_t, seeded,
                                  default_generator)
    logits = logits / temperature
    if top_kp:
        logits = apply_top_k_top_p(logits, k, top_p, host_k, host_p)
    if min_p_t is not None:
        logits = apply_min_p(logits, min_p_t)
    if use_kernel:  # the race over the filtered logits (already divided)
        ones = torch.ones(len(logits), dtype=torch.float32, device=logits.device)
        return _race(logits, ones, torch.zeros_like(ones), seeded, default_generator, split)
    return _exponential_race(torch.softmax(logits, dim=-1), seeded, default_generator)


def _sample_candidates(logits: torch.Tensor, k_max: int, temperature: torch.Tensor,
                       k: torch.Tensor, p: torch.Tensor, min_p: torch.Tensor | None,
                       seeded: SeededRows | None,
                       default_generator: torch.Generator | None) -> torch.Tensor:
    """The exponential race among each row's k_max largest logits (`_sample_filtered`).

    Division by a positive temperature keeps the order, so the selection runs on the logits
    as they are and only the candidates are divided. Then `prefix_filters` (top-k, top-p)
    and `apply_min_p`, whose row maximum is the same among the candidates. The noise is
    drawn for the whole vocabulary as the full-row path draws it (a seeded row's draws depend
    only on its seed and step) and read at the candidates. About a dozen passes over
    [B, vocab] fewer than the full-row path (the division, the filters' masks and scatter,
    min-p's, the softmax and the race), 155 MB each at 256 rows of a 151,936-token
    vocabulary in float32.

    Args:
        logits: [B, vocab], not modified.
        k_max: candidates per row, >= every sampled row's k.
        temperature, k, p: [B, 1] float32, int64 (in [1, vocab]), float32.
        min_p: [B, 1] float32, or None when no row has one.
    Returns:
        [B] int64 token ids.
    """
    values, order = logits.topk(k_max, dim=-1)  # [B, k_max], descending
    values = prefix_filters(values / temperature, k, p)
    if min_p is not None:
        values = apply_min_p(values, min_p)
    q = _exponential_noise(logits.shape, logits.device, seeded, default_generator)
    pick = _race_argmax(torch.softmax(values, dim=-1), q.gather(1, order))
    return order.gather(1, pick[:, None]).squeeze(1)


def _seeded(state: SamplingState, rows: np.ndarray, num_tokens: np.ndarray) -> SeededRows:
    """The sampled rows that draw from their own key (indices in `rows`), with numpy."""
    index = np.flatnonzero(state.seeded[rows])
    picked = rows[index]
    return SeededRows(index, state.seed_key[picked], num_tokens[picked])


def _race(logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
          seeded: SeededRows | None,
          default_generator: torch.Generator | None, split: bool = False) -> torch.Tensor:
    """`race_argmax_triton` (pagedrt/ops/sample_triton.py) over `_exponential_noise`'s draws:
    the tokens of `_exponential_race` on softmax(logits / temperature), argmax for greedy
    rows. With split, each row's vocabulary in `sample_splits` spans (the same tokens).
    Returns [B] int64."""
    from pagedrt.ops.sample_triton import race_argmax_triton, sample_splits
    from pagedrt.ops.triton_utils import device_sms

    num_splits = sample_splits(*logits.shape, device_sms(logits)) if split else None
    noise = _exponential_noise(logits.shape, logits.device, seeded, default_generator)
    return race_argmax_triton(logits, noise, temperature, greedy, num_splits)


def _split_argmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """torch.argmax(logits, -1) by `sample_triton.argmax_triton` (the default;
    PAGEDRT_SAMPLE_SPLIT=0 keeps torch.argmax), into `out` where given. Returns [B] int64."""
    from pagedrt.ops.sample_triton import argmax_triton

    return argmax_triton(logits, out=out)


class SeededRows(NamedTuple):
    """Rows of a batch that draw their noise from their own key (pagedrt/ops/philox.py).

    Attributes:
        index: [S] int64, the rows' indices in the batch.
        keys: [S] int64, their keys (`seed_key`).
        positions: [S] int64, the position of the token each samples (prompt included).
    """

    index: np.ndarray
    keys: np.ndarray
    positions: np.ndarray


def seeded_rows(batch_rows: list) -> SeededRows:
    """The `SeededRows` of a batch's rows (objects with the attributes of `SamplingRow`): those
    with a seed that are not greedy, each sampling the token after its prompt and output."""
    index = [i for i, r in enumerate(batch_rows) if r.seed is not None and not r.params.greedy]
    rows = [batch_rows[i] for i in index]
    return SeededRows(
        np.asarray(index, dtype=np.int64),
        np.asarray([seed_key(r.seed, r.sample_index) for r in rows], dtype=np.int64),
        np.asarray([len(r.prompt_token_ids) + len(r.output_token_ids) for r in rows],
                   dtype=np.int64))


def fill_seeded_draws_(out: torch.Tensor, seeded: SeededRows, offsets: np.ndarray,
                       stream: int, exponential: bool) -> None:
    """Overwrite the seeded rows' draws in `out` ([B, P, W] float32, unit stride along W):
    out[index[s], p] = the draws of row s at positions[s] + offsets[p] (one host-to-device
    copy of the indices and one launch, whatever S; `philox.fill_counter_draws_`)."""
    s = len(seeded.index)
    if not s:
        return
    positions = seeded.positions[:, None] + offsets[None, :]
    flat = to_device(np.concatenate([seeded.index, seeded.keys, positions.ravel()]), out.device,
                     torch.int64)
    index, keys, positions_t = torch.split(flat, [s, s, positions.size])
    fill_counter_draws_(out, index, keys, positions_t.view(s, len(offsets)), stream, exponential)


def _exponential_noise(shape: torch.Size, device: torch.device, seeded: SeededRows | None,
                       default_generator: torch.Generator | None) -> torch.Tensor:
    """[B, vocab] float32 Exp(1) draws: one draw from the default generator for the whole
    batch, then the `seeded` rows overwritten by their own keys' draws at the positions they
    sample (stream `STREAM_RACE`), which depend on nothing else."""
    q = torch.empty(shape, dtype=torch.float32, device=device).exponential_(
        generator=default_generator)
    if seeded is not None:
        fill_seeded_draws_(q.unsqueeze(1), seeded, _NO_OFFSET, STREAM_RACE, exponential=True)
    return q


_NO_OFFSET = np.zeros(1, dtype=np.int64)
_NO_ROWS = np.zeros(0, dtype=np.int64)


def _exponential_race(probs: torch.Tensor, seeded: SeededRows | None,
                      default_generator: torch.Generator | None) -> torch.Tensor:
    """argmax of probs / q, q ~ Exp(1) (`_exponential_noise`). probs: [B, vocab] float32.
    Returns [B] int64."""
    q = _exponential_noise(probs.shape, probs.device, seeded, default_generator)
    return _race_argmax(probs, q)


def _race_argmax(probs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension of probs / q for Exp(1) draws q of the same shape
    (clamped in place). Returns the indices, int64."""
    # Exp(1) can round to 0; 0 / 0 would be NaN, which argmax would pick.
    q.clamp_(min=torch.finfo(q.dtype).tiny)
    return (probs / q).argmax(dim=-1)


def gather_logprobs(raw_logprobs: torch.Tensor, token_ids: torch.Tensor,
                    rows: list[SamplingRow]) -> list[TokenLogprobs | None]:
    """TokenLogprobs of `token_ids` ([B] int64) under `raw_logprobs` ([B, vocab]) for the rows
    that asked (None elsewhere); one host sync."""
    return _gather_logprobs(raw_logprobs, token_ids, rows)


def plain_greedy(p: SamplingParams) -> bool:
    """Greedy with nothing that reads or changes the logits before the argmax."""
    return (p.greedy and p.logprobs is None and p.min_tokens == 0
            and not p.reads_output_tokens and not p.adjusts_logits)


def _gather_logprobs(
    raw_logprobs: torch.Tensor, token_ids: torch.Tensor, rows: list[SamplingRow]
) -> list[TokenLogprobs | None]:
    """Per-row chosen-token logprob, rank and top-n list (one host sync for the whole batch)."""
    num_top = max(r.params.logprobs or 0 for r in rows)
    chosen = raw_logprobs.gather(1, token_ids.unsqueeze(1))  # [B, 1]
    ranks = (raw_logprobs > chosen).sum(dim=-1) + 1  # [B]
    top_values, top_ids = raw_logprobs.topk(num_top, dim=-1)  # [B, num_top]
    chosen_l, ranks_l, ids_l = chosen.squeeze(1).tolist(), ranks.tolist(), token_ids.tolist()
    top_values_l, top_ids_l = top_values.tolist(), top_ids.tolist()
    result: list[TokenLogprobs | None] = []
    for i, r in enumerate(rows):
        n = r.params.logprobs
        top = list(zip(top_ids_l[i][: n or 0], top_values_l[i][: n or 0]))
        entry = TokenLogprobs(ids_l[i], chosen_l[i], ranks_l[i], top)
        result.append(entry if n is not None else None)
    return result
