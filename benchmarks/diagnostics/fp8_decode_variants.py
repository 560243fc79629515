"""Where does the FP8-cache decode kernel lose its time? A diagnostic for issue 17, not a
benchmark of record.

    PYTHONPATH=$PWD python3 benchmarks/diagnostics/fp8_decode_variants.py [--out DIR]

A stripped copy of the decode kernel's inner loop (pagedrt/ops/attention_triton.py: one
program per (kv head, split, sequence), online softmax, no window, partial outputs written,
no reduce) with switches, timed on the same random cache in bf16 and in FP8 (e4m3, one scale
per token and head):

- CVT: how fp8 becomes a 16-bit MMA operand: 0 = `.to(fp16)` (the engine's kernel), 1 = bit
  arithmetic (sign | exponent-mantissa << 7 read as fp16 = value / 256, exact for every finite
  e4m3 value; the 256 goes into the scales);
- V_DIM_MAJOR: V stored per block as [head_dim, block_size] (tokens contiguous), the layout
  in which the P @ V operand needs no transposition of 8-bit data;
- SKIP_PV: no P @ V product (what the loads, the conversion of K and Q @ K^T cost alone);
- RT: strides as runtime arguments instead of literals (measured 2026-12-02: no difference);
- SEQ_PTR: seq_len loaded per sequence, as the engine's kernel does, instead of one integer
  argument (which Triton specializes as a multiple of 16, so per-token masks against it are
  known constant over 16 tokens) -- the engine's kernel read dim-major V at 485 us where
  this one took 186 (Llama-3-8B heads, B64 L4096), and this is the last difference left;
- MASK (dim-major V, with SEQ_PTR): 0 per-token load mask; 1 the load masked by whole
  blocks, slots past the end zeroed in every tile; 2 zeroed in the last tile only (an `if`
  in the loop; this form in the engine's kernel took 671 us); 3 the full tiles with no mask
  at all and the one partial tile, if any, masked (the usual even/odd-tile split).

Each variant's output is checked against a float32 reference first (SKIP_PV excepted).
Prints one line per (shape, variant): time in us and the cache bytes read per second.
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import torch
import triton
import triton.language as tl

from pagedrt.ops.attention_triton import choose_num_splits
from pagedrt.ops.fp8 import quantize_fp8
from pagedrt.ops.triton_utils import device_sms

SHAPES = {"llama3-8b": (32, 8, 128), "qwen2-0.5b": (14, 2, 64)}


@triton.jit
def _fp8_to_f16(x, CVT: tl.constexpr):
    """e4m3 bytes (uint8) as fp16: CVT 0 by conversion; CVT 1 by bit arithmetic (value / 256)."""
    if CVT == 1:
        xb = x.to(tl.int16)
        return (((xb & 0x80) << 8) | ((xb & 0x7F) << 7)).to(tl.float16, bitcast=True)
    return x.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _tile(m_i, l_i, acc, tile_start, q, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, seq, stride_bt,
          kv_head, end, scale_log2, stride_s, stride_b, stride_vh,
          NUM_KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_N: tl.constexpr, FP8: tl.constexpr, CVT: tl.constexpr,
          V_DIM_MAJOR: tl.constexpr, SKIP_PV: tl.constexpr, MASKED: tl.constexpr,
          VMASK: tl.constexpr):
    """One BLOCK_N-token tile of the online softmax; MASKED False: every token is below `end`
    (no load is masked)."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tile_start + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    if MASKED:
        block = tl.load(bt_ptr + seq * stride_bt + offs_n // BLOCK_SIZE, mask=n_mask,
                        other=0).to(tl.int64)
    else:
        block = tl.load(bt_ptr + seq * stride_bt + offs_n // BLOCK_SIZE).to(tl.int64)
    kv_off = block * stride_b + (offs_n % BLOCK_SIZE) * stride_s + kv_head * HEAD_DIM
    if MASKED:
        k = tl.load(k_ptr + kv_off[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0)
    else:
        k = tl.load(k_ptr + kv_off[:, None] + offs_d[None, :])
    if FP8:
        k = _fp8_to_f16(k, CVT)
    s = tl.dot(q, tl.trans(k)) * scale_log2
    scale_off = block * (NUM_KV_HEADS * BLOCK_SIZE) + kv_head * BLOCK_SIZE + offs_n % BLOCK_SIZE
    if FP8:
        if MASKED:
            s = s * tl.load(ks_ptr + scale_off, mask=n_mask, other=0.0)[None, :]
        else:
            s = s * tl.load(ks_ptr + scale_off)[None, :]
    if MASKED:
        s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if SKIP_PV:
        acc = acc * alpha[:, None]
    else:
        if V_DIM_MAJOR:  # v_ptr: [num_blocks, num_kv_heads, head_dim, block_size]
            v_ptrs = v_ptr + (block * stride_b + kv_head * stride_vh
                              + offs_n % BLOCK_SIZE)[None, :] + offs_d[:, None] * BLOCK_SIZE
            if not MASKED:
                vt = tl.load(v_ptrs)
            elif VMASK == 0:  # per token
                vt = tl.load(v_ptrs, mask=n_mask[None, :], other=0)  # [HEAD_DIM, BLOCK_N]
            else:  # whole blocks (constant over BLOCK_SIZE tokens), then zero past `end`
                blk_mask = offs_n // BLOCK_SIZE < tl.cdiv(end, BLOCK_SIZE)
                vt = tl.load(v_ptrs, mask=blk_mask[None, :], other=0)
                if VMASK == 1:  # every tile  # noqa: SIM114 - constexpr, then runtime
                    vt = tl.where(n_mask[None, :], vt, 0)
                elif tile_start + BLOCK_N > end:  # VMASK 2: the last tile only
                    vt = tl.where(n_mask[None, :], vt, 0)
            v = tl.trans(vt)
        elif MASKED:
            v = tl.load(v_ptr + kv_off[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0)
        else:
            v = tl.load(v_ptr + kv_off[:, None] + offs_d[None, :])
        if FP8:
            v = _fp8_to_f16(v, CVT)
            if MASKED:
                v_scale = tl.load(vs_ptr + scale_off, mask=n_mask, other=0.0)
            else:
                v_scale = tl.load(vs_ptr + scale_off)
            v_max = tl.max(v_scale, 0)
            v_max = tl.where(v_max > 0, v_max, 1.0)
            pv = tl.dot((p * (v_scale / v_max)[None, :]).to(tl.float16), v) * v_max
            if CVT == 1:
                pv = pv * 256.0
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _variant_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, part_out_ptr, part_lse_ptr,
                    seq_len, seq_lens_ptr,
                    scale_log2, num_splits, stride_bt, rt_stride_s, rt_stride_b, rt_stride_vh,
                    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                    FP8: tl.constexpr, CVT: tl.constexpr, V_DIM_MAJOR: tl.constexpr,
                    SKIP_PV: tl.constexpr, RT: tl.constexpr = False,
                    SEQ_PTR: tl.constexpr = False, MASK: tl.constexpr = 0):
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    if SEQ_PTR:  # per sequence from memory, as the engine reads it: no divisibility known
        seq_len = tl.load(seq_lens_ptr + seq)
    part_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * part_len
    end = tl.minimum(start + part_len, seq_len)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    q = tl.load(q_ptr + (seq * NUM_KV_HEADS * GROUP + heads[:, None]) * HEAD_DIM
                + offs_d[None, :], mask=g_mask[:, None], other=0.0)
    if FP8:
        q = (q.to(tl.float32) * 0.015625).to(tl.float16)
        scale_log2 = scale_log2 * 64.0
        if CVT == 1:
            scale_log2 = scale_log2 * 256.0
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    stride_s = NUM_KV_HEADS * HEAD_DIM
    stride_b = BLOCK_SIZE * stride_s
    stride_vh = HEAD_DIM * BLOCK_SIZE
    if RT:  # the strides as runtime arguments, as the engine's kernel takes them by default
        stride_s = rt_stride_s
        stride_b = rt_stride_b
        stride_vh = rt_stride_vh
    # (the calls spelled out: the compiler takes no * or ** unpacking in a kernel)
    if MASK == 3:  # full tiles without masks, then the one partial tile (if any) with them
        full_end = start + (end - start) // BLOCK_N * BLOCK_N
        for tile_start in range(start, full_end, BLOCK_N):
            m_i, l_i, acc = _tile(m_i, l_i, acc, tile_start, q, k_ptr, v_ptr, ks_ptr, vs_ptr,
                                  bt_ptr, seq, stride_bt, kv_head, end, scale_log2, stride_s,
                                  stride_b, stride_vh, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM,
                                  BLOCK_N, FP8, CVT, V_DIM_MAJOR, SKIP_PV, False, 0)
        if full_end < end:
            m_i, l_i, acc = _tile(m_i, l_i, acc, full_end, q, k_ptr, v_ptr, ks_ptr, vs_ptr,
                                  bt_ptr, seq, stride_bt, kv_head, end, scale_log2, stride_s,
                                  stride_b, stride_vh, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM,
                                  BLOCK_N, FP8, CVT, V_DIM_MAJOR, SKIP_PV, True, 0)
    else:
        for tile_start in range(start, end, BLOCK_N):
            m_i, l_i, acc = _tile(m_i, l_i, acc, tile_start, q, k_ptr, v_ptr, ks_ptr, vs_ptr,
                                  bt_ptr, seq, stride_bt, kv_head, end, scale_log2, stride_s,
                                  stride_b, stride_vh, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM,
                                  BLOCK_N, FP8, CVT, V_DIM_MAJOR, SKIP_PV, True, MASK)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    row = (seq * NUM_KV_HEADS * GROUP + heads) * num_splits + split
    tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out,
             mask=g_mask[:, None])
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(part_lse_ptr + row, lse, mask=g_mask)


def combine(part, part_lse):
    """The reduce, in torch: part [S, H, splits, D], part_lse [S, H, splits] (log2)."""
    out, lse = part, part_lse
    w = torch.softmax(lse * 0.6931471805599453, dim=-1)
    return (out * w[..., None]).sum(2)


def reference(q, k, v, block_tables, ctx):
    """float32 decode attention of q [S, H, D] over k, v [blocks, block_size, KVH, D]."""
    num_seqs, h, d = q.shape
    kvh = k.shape[2]
    k = k[block_tables.long()].flatten(1, 2)[:, :ctx]  # [S, ctx, KVH, D]
    v = v[block_tables.long()].flatten(1, 2)[:, :ctx]
    qq = q.float().view(num_seqs, kvh, h // kvh, d)
    s = torch.einsum("skgd,sckd->skgc", qq, k.float()) * d ** -0.5
    return torch.einsum("skgc,sckd->skgd", s.softmax(-1), v.float()).reshape(num_seqs, h, d)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--cases", default="llama3-8b:64:4096,qwen2-0.5b:64:4096")
    p.add_argument("--quick", action="store_true",
                   help="FP8 with cvt 0 only: literal and runtime strides, seq_len from memory "
                        "with the V masks (per token, by block, by block + last tile), two "
                        "launch settings")
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, no timing
    block_size = 16
    rows, results = [], []
    for case in args.cases.split(","):
        model, num_seqs, ctx = case.split(":")
        num_seqs, ctx = int(num_seqs), int(ctx)
        h, kvh, d = SHAPES[model]
        g = torch.Generator(device=dev).manual_seed(0)
        nb_seq = triton.cdiv(ctx, block_size)
        nb = num_seqs * nb_seq + 1
        q = torch.randn(num_seqs, h, d, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(nb, block_size, kvh, d, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        bt = torch.randperm(nb, device=dev, generator=g)[: num_seqs * nb_seq].view(
            num_seqs, nb_seq).to(torch.int32)
        (k8, ks), (v8, vs) = (quantize_fp8(x.flatten(0, 1)) for x in (k, v))
        k8, v8 = (x.view(nb, block_size, kvh, d).view(torch.uint8) for x in (k8, v8))
        ks, vs = (x.view(nb, block_size, kvh).transpose(1, 2).contiguous() for x in (ks, vs))
        v8_t = v8.permute(0, 2, 3, 1).contiguous()  # [nb, kvh, d, block_size]
        v_t = v.permute(0, 2, 3, 1).contiguous()
        splits = choose_num_splits(num_seqs, kvh, ctx, device_sms(q))
        kf = (k8.view(torch.float8_e4m3fn).float() * ks.transpose(1, 2)[..., None])
        vf = (v8.view(torch.float8_e4m3fn).float() * vs.transpose(1, 2)[..., None])
        part = torch.empty(num_seqs, h, splits, d, device=dev, dtype=torch.float32)
        part_lse = torch.empty(num_seqs, h, splits, device=dev, dtype=torch.float32)

        refs = {False: reference(q, k, v, bt, ctx), True: reference(q, kf, vf, bt, ctx)}
        # (fp8, cvt, v_dim_major, skip_pv, runtime strides, seq_len from memory, V mask)
        variants = [(False, 0, 0, 0, 0, 0, 0), (False, 0, 1, 0, 0, 0, 0),
                    (False, 0, 0, 1, 0, 0, 0), (True, 0, 0, 0, 0, 0, 0), (True, 1, 0, 0, 0, 0, 0),
                    (True, 0, 1, 0, 0, 0, 0), (True, 1, 1, 0, 0, 0, 0), (True, 0, 0, 1, 0, 0, 0),
                    (True, 1, 0, 1, 0, 0, 0), (True, 0, 0, 0, 1, 0, 0), (True, 0, 1, 0, 1, 0, 0)]
        if args.quick:
            variants = [(False, 0, 0, 0, 0, 0, 0), (True, 0, 0, 0, 0, 0, 0),
                        (True, 0, 1, 0, 0, 0, 0), (True, 0, 1, 0, 1, 0, 0),
                        (True, 0, 1, 0, 0, 1, 0), (True, 0, 1, 0, 0, 1, 1),
                        (True, 0, 1, 0, 0, 1, 2), (True, 0, 1, 0, 0, 1, 3),
                        (True, 0, 0, 0, 0, 1, 3), (False, 0, 0, 0, 0, 1, 3),
                        (False, 0, 0, 0, 0, 1, 0)]
        seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=dev)
        for fp8, cvt, vdm, skip, rt, seq_ptr, vmask in variants:
            kk = k8 if fp8 else k
            vv = (v8_t if vdm else v8) if fp8 else (v_t if vdm else v)
            name = (f"{'fp8' if fp8 else 'bf16'} cvt={cvt} v_dim_major={vdm} "
                    f"skip_pv={skip} rt={rt} seq_ptr={seq_ptr} mask={vmask}")
            settings = [(64, 4, 3), (128, 4, 3), (128, 4, 2), (64, 4, 2)]
            for bn, warps, stages in settings[1:3] if args.quick else settings:
                if not fp8 and d == 128 and bn == 128:
                    continue
                fn = functools.partial(
                    _variant_kernel[(kvh, splits, num_seqs)], q, kk, vv, ks, vs, bt, part, part_lse,
                    ctx, seq_lens, d ** -0.5 * 1.4426950408889634, splits, bt.stride(0),
                    kvh * d, block_size * kvh * d, d * block_size, RT=rt, SEQ_PTR=seq_ptr,
                    MASK=vmask,
                    NUM_KV_HEADS=kvh, GROUP=h // kvh, GROUP_PAD=max(16, triton.next_power_of_2(
                        h // kvh)), BLOCK_SIZE=block_size, HEAD_DIM=d, BLOCK_N=bn, FP8=fp8,
                    CVT=cvt, V_DIM_MAJOR=vdm, SKIP_PV=skip, num_warps=warps,
                    num_stages=stages)
                try:
                    fn()
                    err = None
                    if not skip:
                        out = combine(part, part_lse)
                        err = (out - refs[fp8]).abs().max().item()
                    ms = triton.testing.do_bench_cudagraph(fn, rep=30) if dev == "cuda" else 1.0
                except Exception as e:  # noqa: BLE001 - report and go on
                    rows.append(f"{case:24s} {name:40s} BN{bn} w{warps} s{stages} FAILED "
                                f"{str(e)[:120]}")
                    print(rows[-1], flush=True)
                    continue
                nbytes = num_seqs * ctx * kvh * 2 * (d * (1 if fp8 else 2) + (4 if fp8 else 0))
                results.append({"case": case, "fp8": fp8, "cvt": cvt, "v_dim_major": vdm, "rt": rt,
                                "seq_ptr": seq_ptr, "mask": vmask,
                                "skip_pv": skip, "BLOCK_N": bn, "num_warps": warps,
                                "num_stages": stages, "splits": splits, "us": ms * 1e3,
                                "tb_s": nbytes / ms / 1e9, "max_err": err})
                rows.append(f"{case:24s} {name:40s} BN{bn:<3d} w{warps} s{stages} "
                            f"{ms * 1e3:7.1f} us {nbytes / ms / 1e9:5.2f} TB/s err "
                            f"{err if err is None else round(err, 4)}")
                print(rows[-1], flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fp8_decode_variants.json"), "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name() if dev == "cuda" else dev, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
