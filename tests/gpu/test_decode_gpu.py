"""The default decode launch over 16-bit caches, compiled on a CUDA GPU, against the reference:
the warp-tile kernel at head_dim 64 (`_decode_launch_config`) and `_decode_kernel` at 128, GQA
groups 1 to 8, contexts at and one past block and tile boundaries, one token, long contexts,
shuffled blocks with NaN in every unused slot, split counts from the heuristic and given, and
the split-K reduce with 1 to 16 query heads per program (`reduce_heads_per_program`). The CPU
tests run the same kernels under the interpreter, which upcasts the products to fp32; here
they run in bf16 and fp16 as the engine runs them.
Run on the H200: python3 -m pytest -m gpu tests/gpu/test_decode_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
BLOCK_SIZE = 16


def paged_case(lens: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype,
               seed: int):
    """Caches on the GPU with each sequence's K/V in shuffled blocks and NaN everywhere else;
    block tables padded with a NaN block that is not the sequence's."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [max(1, -(-n // BLOCK_SIZE)) for n in lens]
    num_blocks = sum(per_seq) + 2
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k = torch.full(shape, float("nan"), dtype=dtype)
    v = torch.full(shape, float("nan"), dtype=dtype)
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.full((len(lens), max(per_seq)), int(perm[-1]), dtype=torch.int32)
    at = 0
    for i, n in enumerate(lens):
        for j in range(per_seq[i]):
            block, used = int(perm[at]), min(BLOCK_SIZE, n - j * BLOCK_SIZE)
            tables[i, j] = block
            k[block, :used] = torch.randn(used, num_kv_heads, head_dim, generator=g).to(dtype)
            v[block, :used] = torch.randn(used, num_kv_heads, head_dim, generator=g).to(dtype)
            at += 1
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return k.to(CUDA), v.to(CUDA), tables.to(CUDA), seq_lens.to(CUDA)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 3, 7, 8])
def test_default_decode_matches_reference(dtype, head_dim, group):
    num_kv_heads = 2
    lens = [1, 15, 16, 17, 31, 32, 33, 64, 65, 500, 4096, 4097]
    k, v, bt, seq_lens = paged_case(lens, num_kv_heads, head_dim, dtype, seed=group)
    query = torch.randn(len(lens), num_kv_heads * group, head_dim, device=CUDA).to(dtype)
    scale = head_dim ** -0.5
    expected = ref.paged_attention_decode_reference(query.float(), k.float(), v.float(), bt,
                                                    seq_lens, scale)
    for num_splits, config in ((None, None), (1, None), (3, None), (64, None),
                               (8, {"reduce_heads": 1}), (8, {"reduce_heads": 16})):
        if config and head_dim == 64:  # keep the default kernel, change only the reduce
            config = {**tri._decode_launch_config(head_dim, 2), **config}
        out = tri.paged_attention_decode_triton(query, k, v, bt, seq_lens, scale, num_splits,
                                                config=config)
        assert torch.isfinite(out).all(), (num_splits, config)
        err = (out.float() - expected).abs().max().item()
        assert err < 2e-2, (num_splits, config, err)
