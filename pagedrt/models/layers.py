"""Building blocks of a Llama-family decoder, written for packed tokens `[num_tokens, ...]`.

The linear and embedding layers are tensor-parallel: each is built with the `TPGroup` of its
process (`pagedrt.distributed.group`; `SINGLE_RANK` by default: the whole model on one device)
and owns the slice of the full weight that goes with its rank. `weight_loader(param,
loaded_weight, shard_id)` takes a full, unsharded Hugging Face tensor and copies in that slice,
so a sharded model loads from the same checkpoint. pagedrt/distributed/sharding.py says how the
heads, the MLP and the vocabulary are split; docs/design.md has the picture.

    ColumnParallelLinear   W [out, in], rows split      y_r = x @ W_r.T (output stays sharded)
    RowParallelLinear      W [out, in], columns split   y = all_reduce(x_r @ W_r.T)
    QKVParallelLinear      q, k, v stacked by rows      shard_id "q" | "k" | "v"
    MergedColumnParallel   gate, up stacked by rows     shard_id 0 | 1
    VocabParallelEmbedding rows (token ids) split       masked lookup + all_reduce
    ParallelLMHead         rows (token ids) split       logits gathered over ranks
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from pagedrt.distributed.group import SINGLE_RANK, TPGroup
from pagedrt.distributed.sharding import kv_head_shard, kv_heads_per_rank
from pagedrt.env_flags import env_flag
from pagedrt.ops.attention import triton_available, uses_triton

FUSED_OPS = env_flag("PAGEDRT_FUSED_OPS")
"""Run RMSNorm, RoPE and SiluAndMul as the Triton kernels of `pagedrt.ops.fused_triton`, and
linear layers of 1-4 rows through `pagedrt.ops.gemv_triton` and of 8-128 rows through
`pagedrt.ops.matmul_triton` where faster, on CUDA tensors.
`PAGEDRT_FUSED_OPS=0` (read at import) or setting this to False keeps the eager torch code,
which is always the path on CPU and the oracle the kernels are tested against."""


SMALL_BATCH_FUSION = env_flag("PAGEDRT_FUSED_SMALL_BATCH")
"""With FUSED_OPS, also fold RMSNorm into the projection after it and SiLU-and-mul into the
down projection for 1 to 4 CUDA rows (`pagedrt.ops.gemv_triton`), where timed faster than the
unfused chain. `PAGEDRT_FUSED_SMALL_BATCH=0` (read at import) keeps the chain."""


def _use_fused(x: torch.Tensor) -> bool:
    """Whether the fused Triton kernels should handle this tensor."""
    return FUSED_OPS and x.is_cuda and triton_available()


def _small_batch_fusion(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether x [M, K] (M <= 4 rows, on CUDA) goes through a prologue-fused skinny matmul:
    every weight in x's dtype."""
    from pagedrt.ops.gemv_triton import ENABLED, MAX_ROWS

    return (SMALL_BATCH_FUSION and ENABLED and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS
            and x.stride(-1) == 1 and _use_fused(x) and all(w.dtype == x.dtype for w in weights))


@functools.lru_cache(maxsize=1)
def _fused():
    """The fused Triton ops' module, imported on first use (triton is optional)."""
    from pagedrt.ops import fused_triton

    return fused_triton


def _decode_matmul(x: torch.Tensor) -> bool:
    """Whether x [M, K] (more than 4 rows, on CUDA with Triton) goes to
    `pagedrt.ops.matmul_triton.linear`, which itself takes 8 to 128 rows where timed faster
    than cuBLAS and passes the rest to F.linear (triton is optional: imported only then)."""
    return x.dim() == 2 and x.shape[0] > 4 and _use_fused(x)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear; on CUDA, 1 to 4 rows go through the skinny Triton kernel and 8 to 128 rows
    through the tiled one where it was timed faster (`pagedrt.ops.gemv_triton`,
    `pagedrt.ops.matmul_triton`)."""
    if x.dim() == 2 and x.shape[0] <= 4 and _use_fused(x):
        from pagedrt.ops.gemv_triton import linear

        return linear(x, weight, bias)
    if _decode_matmul(x):
        from pagedrt.ops.matmul_triton import linear

        return linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _divide(numerator: int, denominator: int, what: str) -> int:
    assert numerator % denominator == 0, f"{what}={numerator} not divisible by tp={denominator}"
    return numerator // denominator


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019), optionally fused with the residual add before it.

    `forward(x)` returns the normed x; `forward(x, residual)` first sets
    `residual = x + residual` and returns `(norm(residual), residual)`. Statistics are in fp32.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [num_tokens, hidden_size]."""
        if x.dim() == 2 and _use_fused(x):
            return _fused().rms_norm_triton(x, self.weight, self.eps, residual, validate=False)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def forward_pair(self, x: torch.Tensor, residual: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(norm(x + residual), x + residual)`; without a residual, `(norm(x), x)`: the
        normed input and the residual stream after it, whether or not a residual came in."""
        return (self(x), x) if residual is None else self(x, residual)

    def forward_linear(self, x: torch.Tensor, residual: torch.Tensor | None,
                       linear: LinearBase) -> tuple[torch.Tensor, torch.Tensor]:
        """`(linear(norm(x + residual)), x + residual)`; without a residual, `(linear(norm(x)),
        x)`. x, residual: [num_tokens, hidden_size]. For 1 to 4 rows on CUDA one kernel does the
        add, the norm and the matmul (`gemv_rmsnorm_triton`) where that was timed faster."""
        def unfused():
            h, new_residual = self.forward_pair(x, residual)
            return linear(h), new_residual

        if linear.weight.dim() != 2 or not _small_batch_fusion(x, self.weight, linear.weight):
            return unfused()
        from pagedrt.ops.gemv_triton import fused_or_unfused, gemv_rmsnorm_triton

        bias = linear.bias

        def fused(cfg):
            y, new_residual = gemv_rmsnorm_triton(x, residual, self.weight, self.eps,
                                                  linear.weight, bias, cfg)
            return y, (x if new_residual is None else new_residual)

        key = ("rmsnorm", tuple(linear.weight.shape), x.shape[0], x.dtype, bias is not None,
               residual is not None, x.device.index)
        return fused_or_unfused(key, unfused, fused, linear.weight, x.shape[0], bias is not None)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1 frequency rescaling: slow the low frequencies by `factor`, keep the high ones,
    and interpolate smoothly in between (same formula as transformers' "llama3" rope type)."""
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    old_context_len = scaling.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021) in the Hugging Face "rotate_half" (GPT-NeoX) layout.

    The first and second halves of each head are the two coordinates rotated together. cos and
    sin for every position up to `max_position` are precomputed in fp32 (`cos_sin_cache`,
    `[max_position, head_dim]`: cos in the first half of the columns, sin in the second).
    Build the module in its final dtype rather than calling `.to(dtype)` on it, so the cache
    stays fp32.
    """

    def __init__(
        self, head_dim: int, max_position: int, base: float, rope_scaling: dict | None = None
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (base**exponent)  # [head_dim // 2]
        rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type"))
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, rope_scaling)
        elif rope_type == "linear":  # position interpolation: every frequency / factor
            inv_freq = inv_freq / rope_scaling["factor"]
        elif rope_type not in (None, "default"):
            raise ValueError(f"rope_scaling type {rope_type!r} is not supported; use 'llama3' "
                             "or 'linear'")
        t = torch.arange(max_position, dtype=torch.int64).float()
        freqs = torch.outer(t, inv_freq)  # [max_position, head_dim // 2]
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, head_dim]; cos, sin: [T, 1, head_dim // 2], fp32
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype)

    def forward_and_write_kv(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
        value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor, attention_backend: str,
        k_scales: torch.Tensor | None = None, v_scales: torch.Tensor | None = None,
    ) -> bool:
        """Where the fused kernels run (CUDA, and Triton attention for `attention_backend`):
        rotate query and key in place and write the new key and value into their cache slots
        in one kernel (`fused_triton.rotary_write_kv_triton`; into an FP8 cache the key and
        value rows are left holding what the cache holds, as `ops.attention.paged_attention`
        expects of a fused writer), and return True. Otherwise do
        nothing and return False: the caller rotates with `forward` and attention writes K/V.
        Shapes as `forward`; value like key; caches, an FP8 cache's scales and slot_mapping
        as `ops.attention.write_kv`."""
        if not (_use_fused(query) and uses_triton(attention_backend, query)):
            return False
        _fused().rotary_write_kv_triton(positions, query, key, value, self.cos_sin_cache,
                                        k_cache, v_cache, slot_mapping, validate=False,
                                        k_scales=k_scales, v_scales=v_scales, round_rows=True)
        return True

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate query `[T, num_heads, head_dim]` and key `[T, num_kv_heads, head_dim]` by
        positions `[T]` int64. Returns tensors of the same shapes and dtypes: new ones on the
        torch path; on CUDA the Triton kernel rotates query and key in place and returns them."""
        if _use_fused(query):
            return _fused().rotary_triton(positions, query, key, self.cos_sin_cache,
                                          validate=False)
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)


class SiluAndMul(nn.Module):
    """SwiGLU activation: x = [gate, up] along the last dim -> silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, 2 * d] -> [num_tokens, d]."""
        if x.dim() == 2 and _use_fused(x):
            return _fused().silu_and_mul_triton(x, validate=False)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class LinearBase(nn.Module):
    """y = x @ W.T (+ b), with this rank's shard of W `[output_size, input_size]`."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        self.tp = tp
        self.tp_rank, self.tp_size = tp.rank, tp.size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; this rank computes `output_size // tp.size` of them."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__(input_size, _divide(output_size, tp.size, "output_size"), bias, tp)

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        size = param.shape[0]
        param.data.copy_(loaded_weight.narrow(0, self.tp_rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stacked by rows (gate and up of the MLP); each rank
    holds its slice of every one. shard_id is the index into `output_sizes`."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 tp: TPGroup = SINGLE_RANK) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, tp)

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        assert isinstance(shard_id, int), f"shard_id must be an index, got {shard_id!r}"
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        shard = loaded_weight.narrow(0, self.tp_rank * size, size)
        param.data.narrow(0, offset, size).copy_(shard)

    def silu_mul_of(self, x: torch.Tensor, act: SiluAndMul) -> torch.Tensor:
        """`act(self(x))` for x [num_tokens, input_size], a gate | up pair of outputs: for 8 to
        128 rows on CUDA one kernel does the matmul and the activation in its epilogue
        (`pagedrt.ops.matmul_triton.linear_silu_mul`) where that was timed faster. Column
        parallel, so no collective is timed: each rank chooses for its own shard."""
        if len(self.output_sizes) != 2 or self.bias is not None or not _decode_matmul(x):
            return act(self(x))
        from pagedrt.ops.matmul_triton import linear_silu_mul

        return linear_silu_mul(x, self.weight, lambda: act(self(x)))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; output rows [q | k | v] of this rank's heads.

    With more ranks than KV heads, each KV head is replicated on `tp.size // num_kv_heads`
    ranks (pagedrt/distributed/sharding.py).
    """

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
        bias: bool = False, tp: TPGroup = SINGLE_RANK,
    ) -> None:
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp.size, "num_heads")
        self.num_kv_heads = kv_heads_per_rank(num_kv_heads, tp.size)
        self.kv_shard_rank = kv_head_shard(tp.rank, num_kv_heads, tp.size)
        total_out = (num_heads + 2 * self.num_kv_heads * tp.size) * head_dim
        super().__init__(hidden_size, total_out, bias, tp)

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, rank = 0, q_size, self.tp_rank
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, rank = kv_size, self.kv_shard_rank
        else:
            raise ValueError(f"shard_id={shard_id!r}; use 'q', 'k' or 'v'")
        param.data.narrow(0, offset, size).copy_(loaded_weight.narrow(0, rank * size, size))


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial products are summed with an all-reduce.
    The bias is added once (by rank 0) so the sum counts it once."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__(_divide(input_size, tp.size, "input_size"), output_size, bias, tp)

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        if param.dim() == 1:  # bias: not sharded
            param.data.copy_(loaded_weight)
            return
        size = param.shape[1]
        param.data.copy_(loaded_weight.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduced(_linear(x, self.weight, self.bias if self.tp_rank == 0 else None))

    def _reduced(self, y: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial product y (in place)."""
        if self.tp_size > 1:
            self.tp.all_reduce(y)
        return y

    def forward_silu_mul(self, x: torch.Tensor, act: SiluAndMul) -> torch.Tensor:
        """`self(act(x))` for x [num_tokens, 2 * input_size] (gate | up of this rank); for 1 to
        4 rows on CUDA one kernel does the activation and the matmul (`gemv_silu_mul_triton`)
        where that was timed faster. Not under tensor parallelism: both candidates end in the
        all-reduce, and timing them runs a count of all-reduces that differs between ranks."""
        if not _small_batch_fusion(x, self.weight) or self.tp_size > 1:
            return self(act(x))
        from pagedrt.ops.gemv_triton import fused_or_unfused, gemv_silu_mul_triton

        bias = self.bias if self.tp_rank == 0 else None

        def fused(cfg):
            return self._reduced(gemv_silu_mul_triton(x, self.weight, bias, cfg))

        key = ("silu_mul", tuple(self.weight.shape), x.shape[0], x.dtype, bias is not None,
               x.device.index)
        return fused_or_unfused(key, lambda: self(act(x)), fused, self.weight, x.shape[0],
                                bias is not None)


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the vocabulary (rows) split over ranks.

    Each rank looks up the ids it owns, writes zeros for the others, and an all-reduce sums
    the ranks' rows into the full result `[num_tokens, embedding_dim]`.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 tp: TPGroup = SINGLE_RANK) -> None:
        super().__init__()
        self.tp = tp
        self.tp_rank, self.tp_size = tp.rank, tp.size
        self.num_embeddings = num_embeddings
        self.shard_size = math.ceil(num_embeddings / self.tp_size)
        self.vocab_start = self.tp_rank * self.shard_size
        self.weight = nn.Parameter(
            torch.empty(self.shard_size, embedding_dim), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded_weight, shard_id=None) -> None:
        shard = loaded_weight[self.vocab_start : self.vocab_start + self.shard_size]
        param.data[: shard.shape[0]].copy_(shard)
        param.data[shard.shape[0] :].zero_()  # padding rows of the last rank

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [num_tokens] int64 -> [num_tokens, embedding_dim]."""
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        owned = (local >= 0) & (local < self.shard_size)
        y = F.embedding(local.masked_fill(~owned, 0), self.weight)
        y = y.masked_fill(~owned.unsqueeze(-1), 0)
        return self.tp.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection hidden -> vocab logits; each rank computes its vocab slice and the
    slices are gathered, so every rank holds the full logits (and samples the same tokens)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [num_tokens, hidden] -> logits [num_tokens, num_embeddings]; 1 to 4
        CUDA rows through the skinny Triton matmul where the start-up timing finds it 5%
        faster than cuBLAS (`pagedrt.ops.gemv_triton.linear`; Qwen2-0.5B's 272 MB head at one
        row on an H100: 88.3 against 95.0 us cold in benchmarks/diagnostics/read_floor.py,
        under 5% in the engine's timing, which kept cuBLAS)."""
        if hidden_states.dim() == 2 and hidden_states.shape[0] <= 4 and _use_fused(hidden_states):
            from pagedrt.ops.gemv_triton import linear

            logits = linear(hidden_states, self.weight)
        else:
            logits = F.linear(hidden_states, self.weight)
        if self.tp_size > 1:
            logits = self.tp.all_gather(logits)
        return logits[..., : self.num_embeddings]
