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
                  NUM_CHUNKS: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    ok = offs < vocab
    x = tl.load(logits_ptr + r * stride_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.where(ok, tl.exp(x - m_safe), 0.0), axis=0)
    out = r * NUM_CHUNKS + c
    tl.store(max_ptr + out, m)
    tl.store(sum_ptr + out, s)
    for j in tl.static_range(K):
        v = tl.max(x, axis=0)
        i = tl.min(tl.where((x == v) & ok, offs, vocab), axis=0)
        # (a chunk with fewer than K tokens left: -inf at token 0, never among the K best of a
        # search, which has W x V >= K candidates)
        i = tl.where(i == vocab, 0, i)
        tl.store(vals_ptr + out * K + j, v)
        tl.store(tok_ptr + out * K + j, i.to(tl.int64))
        x = tl.where(offs == i, float("-inf"), x)


@triton.jit
def _search_kernel(vals_ptr, tok_ptr, max_ptr, sum_ptr, scores_ptr, out_val_ptr, out_flat_ptr,
                   vocab, W: tl.constexpr, NUM_CHUNKS: tl.constexpr, K: tl.constexpr,
                   WP: tl.constexpr, CP: tl.constexpr, CKP: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)
    w = tl.arange(0, WP)
    w_ok = w < W
    rows = g * W + w
    cc = tl.arange(0, CP)
    chunk_ok = w_ok[:, None] & (cc[None, :] < NUM_CHUNKS)
    m = tl.load(max_ptr + rows[:, None] * NUM_CHUNKS + cc[None, :], mask=chunk_ok,
                other=float("-inf"))
    s = tl.load(sum_ptr + rows[:, None] * NUM_CHUNKS + cc[None, :], mask=chunk_ok, other=0.0)
    top = tl.max(m, axis=1)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(s * tl.exp(m - top_safe[:, None]), axis=1)
    # (padding rows past W sum to 0: log 1 there, so that no -inf - -inf makes a NaN)
    lse = top_safe + tl.log(tl.where(total > 0, total, 1.0))  # [WP]
    score = tl.load(scores_ptr + rows, mask=w_ok, other=float("-inf"))
    j = tl.arange(0, CKP)
    cand_ok = w_ok[:, None] & (j[None, :] < NUM_CHUNKS * K)
    at = rows[:, None] * (NUM_CHUNKS * K) + j[None, :]
    v = tl.load(vals_ptr + at, mask=cand_ok, other=float("-inf"))
    tok = tl.load(tok_ptr + at, mask=cand_ok, other=0)
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
    if logits.stride(1) != 1 or logits.dtype not in (torch.float16, torch.bfloat16,
                                                     torch.float32):
        raise ValueError(f"logits {logits.dtype} with strides {logits.stride()}: need float16, "
                         f"bfloat16 or float32 with contiguous rows")
    if (tuple(scores.shape) != (num_rows,) or scores.dtype != torch.float32
            or scores.device != logits.device):
        raise ValueError(f"scores {tuple(scores.shape)} {scores.dtype} on {scores.device}: "
                         f"need ({num_rows},) float32 on {logits.device}")
    k, device = num_candidates, logits.device
    block = min(BLOCK, next_pow2(vocab))
    num_chunks = triton.cdiv(vocab, block)
    vals = torch.empty(num_rows, num_chunks, k, dtype=torch.float32, device=device)
    toks = torch.empty(num_rows, num_chunks, k, dtype=torch.int64, device=device)
    maxes = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=device)
    sums = torch.empty_like(maxes)
    values = torch.empty(num_groups, k, dtype=torch.float32, device=device)
    flat = torch.empty(num_groups, k, dtype=torch.int64, device=device)
    if num_groups:
        _chunk_kernel[(num_rows, num_chunks)](
            logits, logits.stride(0), vals, toks, maxes, sums, vocab,
            NUM_CHUNKS=num_chunks, K=k, BLOCK=block, num_warps=4)
        wp, ckp = next_pow2(max(width, 2)), next_pow2(max(num_chunks * k, 2))
        _search_kernel[(num_groups,)](
            vals, toks, maxes, sums, scores.contiguous(), values, flat, vocab,
            W=width, NUM_CHUNKS=num_chunks, K=k, WP=wp, CP=next_pow2(max(num_chunks, 2)),
            CKP=ckp, num_warps=min(16, max(4, wp * ckp // 1024)))  # ~32 candidates a thread
    return values, flat
