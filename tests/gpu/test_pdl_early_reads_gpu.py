"""What the decode kernels read before their PDL wait, checked where it could go wrong: each
kernel under test runs right after a Triton kernel that lets it launch at once
(`pdl_prologue` at its start) and only then, after spinning for about a hundred microseconds,
writes the very input the kernel under test consumes. A kernel that read that input before
its wait would read the zeros left there and give another answer. Covers the defaults (the
1-4-row skinny matmul with and without its RMSNorm prologue, the QKV + RoPE kernel, PRE_K),
against the same launches without the wait in play (a short spin, a synchronize between).
Run on the H200: python3 -m pytest -m gpu tests/gpu/test_pdl_early_reads_gpu.py
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from pagedrt.ops import triton_utils
from pagedrt.ops.triton_utils import pdl_launch, pdl_prologue

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="needs a CUDA GPU of compute capability 9.0 or later")

SPIN = 50_000  # dependent multiply-adds per program after the launch of the next kernel
SETTLE = 64  # fewest spin steps after which acc is exactly 2.0 (2 - 2**-n rounds to 2 in fp32)


@triton.jit
def _late_copy_kernel(src_ptr, dst_ptr, n, spin, BLOCK: tl.constexpr,
                      PDL: tl.constexpr = False):
    """dst = src, written only after `spin` dependent steps that follow this kernel's PDL
    prologue (which lets the next kernel launch). acc = 2 - 2**(1 - spin) in exact arithmetic,
    2.0 in fp32 from about 25 steps on, so with spin >= SETTLE the copy is exact (spin 0 would
    write zeros)."""
    pdl_prologue(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in range(spin):
        acc = acc * 0.5 + 1.0
    tl.store(dst_ptr + offs, (x.to(tl.float32) * (acc * 0.5)).to(dst_ptr.dtype.element_ty),
             mask=mask)


def late_copy(src: torch.Tensor, dst: torch.Tensor, spin: int) -> None:
    """dst (zeroed first) = src by `_late_copy_kernel`, launched with PDL."""
    dst.zero_()
    n = src.numel()
    _late_copy_kernel[(triton.cdiv(n, 1024),)](src, dst, n, spin, BLOCK=1024,
                                              **pdl_launch(triton_utils.pdl_enabled(dst)))


def check_early_reads(src: torch.Tensor, consume) -> None:
    """consume(buffer) right after the late copy of src into a zeroed buffer, against
    consume(buffer) once the copy has finished; compiled first, so that nothing but the
    kernels sits between the two launches."""
    assert triton_utils.pdl_enabled(src), "PDL is off on this GPU: nothing to check"
    buffer = torch.empty_like(src)
    late_copy(src, buffer, SETTLE)  # the exact copy (acc reaches 2.0), finished before consume
    torch.cuda.synchronize()
    want = consume(buffer).clone()  # also compiles
    torch.cuda.synchronize()
    for _ in range(3):
        late_copy(src, buffer, SPIN)
        got = consume(buffer)
        torch.cuda.synchronize()
        assert torch.equal(got, want)


def test_skinny_matmuls_read_only_weights_before_the_wait():
    """gemv, gemv + RMSNorm (x written late), QKV + RoPE, one and four rows, Qwen2-0.5B's K =
    896 (a whole row pre-loaded at 4 rows per program) and the down projection's 4,864 (part)."""
    from pagedrt.ops.gemv_rope_triton import qkv_rope_triton
    from pagedrt.ops.gemv_triton import gemv_rmsnorm_triton, gemv_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16
    heads, kv_heads, d = 14, 2, 64
    cos_sin = torch.randn(64, d, device=dev, generator=g)
    k_cache = torch.zeros(4, 16, kv_heads, d, device=dev, dtype=bf16)
    v_cache = torch.zeros_like(k_cache)
    w_qkv = (torch.randn((heads + 2 * kv_heads) * d, 896, device=dev, generator=g) * 0.02
             ).to(bf16)
    for m in (1, 4):
        for n, k in ((1152, 896), (896, 4864)):
            w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(bf16)
            x = torch.randn(m, k, device=dev, generator=g).to(bf16)
            res = torch.randn(m, k, device=dev, generator=g).to(bf16)
            norm_w = torch.ones(k, device=dev, dtype=bf16)

            def plain(b, w=w):
                return gemv_triton(b, w, None, (4, 512, 4))

            def normed(b, w=w, res=res, norm_w=norm_w):
                return gemv_rmsnorm_triton(b, res, norm_w, 1e-6, w, None, (8, 256, 4))[0]

            check_early_reads(x, plain)
            check_early_reads(x, normed)
        pos = torch.arange(m, device=dev)
        slots = torch.arange(m, device=dev)

        def qkv_rope(b, pos=pos, slots=slots):
            return qkv_rope_triton(b, w_qkv, None, pos, cos_sin, k_cache, v_cache, slots,
                                   heads, kv_heads)[0]

        check_early_reads(torch.randn(m, 896, device=dev, generator=g).to(bf16), qkv_rope)
