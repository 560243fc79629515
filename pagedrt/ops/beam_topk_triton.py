"""Beam search's K best candidates per search in two Triton kernels (docs/design.md, "Beam
search"): what `pagedrt.engine.beam_search.top_candidates` computes, without materialising the
G x W x V float32 cumulative scores.

The torch version takes log_softmax over every slot's V logits, adds the slot's score and runs
`topk` over each search's W x V values: several full passes over a [G * W, V] float32 tensor
per step (for 256 slots of a 151,936-token vocabulary, 155 MB each), and a `topk` over slices
of W x V that only G blocks share. Here:

  1. `_chunk_kernel`, one program per (slot, chunk of BLOCK logits): the chunk's maximum m, its
     sum of exp(x - m), and its K largest logits with their token ids (K rounds of a max and
     the lowest index holding it). One read of the logits.
  2. `_search_kernel`, one program per search: each slot's log-sum-exp from its chunks'
     (m, sum), the candidates' values (x - lse) + score, and the K best of the search's
     W x chunks x K candidates, best first (ties: the lower flat index first).

With `LSE` off the kernels are a plain row top-k (`row_topk_triton`: each row is a search of
width 1, its values the logits themselves): the sampler's selection of its top-k candidates
(pagedrt/engine/sampler.py, `_row_topk`), where `torch.topk` over [256, 151,936] float32
logits took about 0.8 ms on the H200.

Exact as a selection: a candidate among a search's K best is among its chunk's K best (fewer
than K values of the chunk exceed it), so the union of the chunks' K best holds the search's K
best. The values are log_softmax(x) + score up to float32 rounding of the log-sum-exp (a few
ulps; the torch version remains the reference and the CPU path, tests/test_beam_topk_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedrt.ops.triton_utils import next_pow2

BLOCK = 2048  # logits per program of the chunk kernel


@triton.jit
def _chunk_kernel(logits_ptr, stride_row, vals_ptr, tok_ptr, max_ptr, sum_ptr, vocab,
                  NUM_CHUNKS: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
                  LSE: tl.constexpr = True):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    ok = offs < vocab
    x = tl.load(logits_ptr + r * stride_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
    out = r * NUM_CHUNKS + c
    if LSE:  # the chunk's share of its row's log-sum-exp
        m = tl.max(x, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.where(ok, tl.exp(x - m_safe), 0.0), axis=0)
        tl.store(max_ptr + out, m)
        tl.store(sum_ptr + out, s)
    alive = ok  # tokens not taken yet: -inf logits are taken once each, lowest id first
    for j in tl.static_range(K):
        v = tl.max(tl.where(alive, x, float("-inf")), axis=0)
        i = tl.min(tl.where((x == v) & alive, offs, vocab), axis=0)
        # (a chunk with fewer than K tokens left: -inf at token 0, never among the K best of a
        # search or row, which has at least K distinct tokens among its chunks' candidates)
        i = tl.where(i == vocab, 0, i)
        tl.store(vals_ptr + out * K + j, v)
        tl.store(tok_ptr + out * K + j, i.to(tl.int64))
        alive = alive & (offs != i)


@triton.jit
def _search_kernel(vals_ptr, tok_ptr, max_ptr, sum_ptr, scores_ptr, out_val_ptr, out_flat_ptr,
                   vocab, W: tl.constexpr, NUM_CHUNKS: tl.constexpr, K: tl.constexpr,
                   WP: tl.constexpr, CP: tl.constexpr, CKP: tl.constexpr,
                   LSE: tl.constexpr = True):
    g = tl.program_id(0).to(tl.int64)
    w = tl.arange(0, WP)
    w_ok = w < W
    rows = g * W + w
    j = tl.arange(0, CKP)
    cand_ok = w_ok[:, None] & (j[None, :] < NUM_CHUNKS * K)
    at = rows[:, None] * (NUM_CHUNKS * K) + j[None, :]
    v = tl.load(vals_ptr + at, mask=cand_ok, other=float("-inf"))
    tok = tl.load(tok_ptr + at, mask=cand_ok, other=0)
    value = v
    if LSE:  # log_softmax(x) + the slot's score
        cc = tl.arange(0, CP)
        chunk_ok = w_ok[:, None] & (cc[None, :] < NUM_CHUNKS)
        m = tl.load(max_ptr + rows[:, None] * NUM_CHUNKS + cc[None, :], mask=chunk_ok,
                    other=float("-inf"))
        s = tl.load(sum_ptr + rows[:, None] * NUM_CHUNKS + cc[None, :], mask=chunk_ok,
                    other=0.0)
        top = tl.max(m, axis=1)
        top_safe = tl.where(top == float("-inf"), 0.0, top)
        total = tl.sum(s * tl.exp(m - top_safe[:, None]), axis=1)
        # (padding rows past W sum to 0: log 1 there, so that no -inf - -inf makes a NaN)
        lse = top_safe + tl.log(tl.where(total > 0, total, 1.0))  # [WP]
        score = tl.load(scores_ptr + rows, mask=w_ok, other=float("-inf"))
        value = (v - lse[:, None]) + score[:, None]
    value = tl.where(cand_ok, value, float("-inf"))
    flat = w[:, None].to(tl.int64) * vocab + tok
    none = W * vocab  # larger than every flat index
    flat = tl.where(cand_ok, flat, none)
    for k in tl.static_range(K):
        best = tl.max(tl.max(value, axis=1), axis=0)
        f = tl.min(tl.min(tl.where(value == best, flat, none), axis=1), axis=0)
        tl.store(out_val_ptr + g * K + k, best)
        tl.store(out_flat_ptr + g * K + k, f)
        taken = flat == f
        value = tl.where(taken, float("-inf"), value)
        flat = tl.where(taken, none, flat)  # (never again, even among -inf values)


def beam_top_candidates_triton(logits: torch.Tensor, scores: torch.Tensor, width: int,
                               num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K best candidates of each of G searches of W beams, as `top_candidates` (see the
    module docstring); no host sync.

    Args:
        logits: [G * W, V] float16, bfloat16 or float32 (rows may be strided): search g's slot s
            in row g * W + s.
        scores: [G * W] float32 each slot's cumulative log-probability (-inf: no beam).
        width: W; num_candidates: K, with W <= K <= W * V.

    Returns:
        (values [G, K] float32 best first: log_softmax(logits) + score of each candidate; flat
         [G, K] int64 its index in the search's W x V scores, beam * V + token).

    Raises:
        ValueError: shapes, dtypes or devices that do not fit the contract.
    """
    num_rows, vocab = logits.shape
    num_groups = num_rows // width if width else 0
    if (width < 1 or num_groups * width != num_rows
            or not width <= num_candidates <= width * vocab):
        raise ValueError(f"{num_rows} logits rows of searches of width {width}, K="
                         f"{num_candidates}, V={vocab}: need rows = G x W and W <= K <= W x V")
    if (tuple(scores.shape) != (num_rows,) or scores.dtype != torch.float32
            or scores.device != logits.device):
        raise ValueError(f"scores {tuple(scores.shape)} {scores.dtype} on {scores.device}: "
                         f"need ({num_rows},) float32 on {logits.device}")
    return _top_candidates(logits, scores, width, num_candidates, True)


def row_topk_triton(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`logits.topk(k, dim=-1)` as two Triton kernels (the module's, `LSE` off): each row's k
    largest values, largest first, ties broken by the lower token id (`torch.topk` leaves
    their order open). No host sync. The chunk kernel takes k rounds of a max over its
    chunk, so it is meant for small k (the sampler uses it up to 64).

    Args:
        logits: [B, V] float16, bfloat16 or float32, rows contiguous (may be strided).
        k: 1 <= k <= V.

    Returns:
        (values [B, k] float32, the logits' values exactly; ids [B, k] int64 token ids).

    Raises:
        ValueError: a k out of range, or logits of another rank, dtype or layout.
    """
    if logits.dim() != 2 or not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k={k} for logits of shape {tuple(logits.shape)}: need [B, V] "
                         "logits and 1 <= k <= V")
    values, ids = _top_candidates(logits, None, 1, k, False)
    return values, ids


def _top_candidates(logits: torch.Tensor, scores: torch.Tensor | None, width: int, k: int,
                    lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two launches behind `beam_top_candidates_triton` (lse: log_softmax + scores) and
    `row_topk_triton` (not lse: the raw values, width 1, no scores)."""
    num_rows, vocab = logits.shape
    if logits.stride(1) != 1 or logits.dtype not in (torch.float16, torch.bfloat16,
                                                     torch.float32):
        raise ValueError(f"logits {logits.dtype} with strides {logits.stride()}: need float16, "
                         f"bfloat16 or float32 with contiguous rows")
    num_groups = num_rows // width
    device = logits.device
    block = min(BLOCK, next_pow2(vocab))
    num_chunks = triton.cdiv(vocab, block)
    vals = torch.empty(num_rows, num_chunks, k, dtype=torch.float32, device=device)
    toks = torch.empty(num_rows, num_chunks, k, dtype=torch.int64, device=device)
    maxes = torch.empty(num_rows, num_chunks if lse else 1, dtype=torch.float32, device=device)
    sums = torch.empty_like(maxes)
    values = torch.empty(num_groups, k, dtype=torch.float32, device=device)
    flat = torch.empty(num_groups, k, dtype=torch.int64, device=device)
    if num_groups:
        _chunk_kernel[(num_rows, num_chunks)](
            logits, logits.stride(0), vals, toks, maxes, sums, vocab,
            NUM_CHUNKS=num_chunks, K=k, BLOCK=block, LSE=lse, num_warps=4)
        wp, ckp = next_pow2(max(width, 2)), next_pow2(max(num_chunks * k, 2))
        _search_kernel[(num_groups,)](
            vals, toks, maxes, sums, scores.contiguous() if lse else maxes, values, flat, vocab,
            W=width, NUM_CHUNKS=num_chunks, K=k, WP=wp, CP=next_pow2(max(num_chunks, 2)),
            CKP=ckp, LSE=lse, num_warps=min(16, max(4, wp * ckp // 1024)))  # ~32 a thread
    return values, flat
