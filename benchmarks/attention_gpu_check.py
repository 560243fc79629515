"""GPU correctness of the Triton attention kernels at real sizes, against the torch reference.

Run on a CUDA machine:  PYTHONPATH=$PWD python3 benchmarks/attention_gpu_check.py [--quick]
Prints one row per case (relative error ||out - ref|| / ||ref||, max abs error, NaN) and a
PASS/FAIL summary; exits 1 on any failure. Caches start NaN-filled, block tables are shuffled.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import torch

from pagedrt.ops import attention_reference as ref
from pagedrt.ops import attention_triton as tri

DEVICE = "cuda"  # tests of this script itself may set "cpu" (with TRITON_INTERPRET=1)
REL_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
DT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def make_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype, device=None):
    """NaN-filled caches; sequence i's K/V in shuffled blocks, NaN past seq_lens[i]."""
    device = device or DEVICE
    blocks_per_seq = [max(1, -(-n // block_size)) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, device=device)
    block_tables = torch.full((len(seq_lens), max(blocks_per_seq)), int(perm[-1]),
                              dtype=torch.int32, device=device)
    used = 0
    for i, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        ids = perm[used:used + nb]
        used += nb
        block_tables[i, :nb] = ids.int()
        kv = torch.randn(2, nb * block_size, num_kv_heads, head_dim, device=device).to(dtype)
        kv[:, n:] = float("nan")
        k_cache[ids] = kv[0].view(nb, block_size, num_kv_heads, head_dim)
        v_cache[ids] = kv[1].view(nb, block_size, num_kv_heads, head_dim)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return k_cache, v_cache, block_tables, seq_lens_t


def compare(out, expected):
    nan = not torch.isfinite(out).all().item()
    diff = (out.double() - expected.double())
    rel = (diff.norm() / expected.double().norm().clamp_min(1e-30)).item()
    return rel, diff.abs().max().item(), nan


DECODE_CASES = [  # (dtype, head_dim, group, block_size, num_kv_heads, seq_lens)
    (torch.bfloat16, 128, 4, 16, 8, [1, 17, 4095, 4096, 4097, 32768]),
    (torch.bfloat16, 128, 8, 32, 4, [16, 31, 1000, 16384, 32768]),
    (torch.bfloat16, 64, 7, 16, 2, [1, 2047, 2048, 2049, 9000]),
    (torch.bfloat16, 64, 1, 8, 4, [7, 8, 9, 513, 20000]),
    (torch.bfloat16, 128, 2, 8, 8, [100, 3000, 32767]),
    (torch.float16, 128, 4, 16, 8, [1, 15, 16, 17, 8191, 32768]),
    (torch.float16, 64, 7, 32, 2, [33, 64, 65, 12345]),
    (torch.float16, 64, 8, 8, 2, [1, 4096]),
    (torch.float32, 128, 4, 16, 2, [1, 17, 5000, 32768]),
    (torch.float32, 64, 7, 8, 2, [9, 2048, 10000]),
    (torch.float16, 16, 2, 16, 2, [1, 40, 100]),
    (torch.bfloat16, 32, 4, 16, 2, [5, 300]),
]
EXTEND_CASES = [  # (dtype, head_dim, group, block_size, num_kv_heads, [(cached, q_len)])
    (torch.bfloat16, 128, 4, 16, 8, [(0, 4096)]),
    (torch.bfloat16, 128, 4, 16, 8, [(0, 1), (16, 5), (17, 16), (1000, 1000), (4000, 17)]),
    (torch.bfloat16, 64, 7, 16, 2, [(0, 2048), (2048, 512), (17, 33), (3, 1)]),
    (torch.float16, 128, 8, 32, 4, [(0, 33), (31, 300), (5000, 64)]),
    (torch.float16, 64, 1, 8, 4, [(0, 9), (8, 8), (100, 1)]),
    (torch.float32, 128, 2, 16, 2, [(0, 500), (16, 17)]),
    (torch.float32, 64, 7, 8, 2, [(17, 100), (0, 1)]),
    (torch.bfloat16, 16, 2, 16, 2, [(0, 70), (16, 5)]),
]


def _guard(rows: list[dict], base: dict, fn) -> None:
    """Run one case; print its row now (a later crash keeps earlier rows); errors are FAILs."""
    try:
        rel, mx, nan = fn()
        row = {**base, "rel_err": rel, "max_abs": mx, "nan": nan,
               "ok": (not nan) and rel < REL_TOL[base["torch_dtype"]]}
    except Exception as e:  # noqa: BLE001 (report and carry on)
        row = {**base, "rel_err": float("nan"), "max_abs": float("nan"), "nan": False,
               "ok": False, "error": repr(e)[:200]}
        print(f"ERROR {base}: {row['error']}")
    row.pop("torch_dtype")
    rows.append(row)
    print_row(row)


def _decode_case(args: tuple, num_splits, expected: torch.Tensor):
    if num_splits == "naive":
        return compare(tri.paged_attention_decode_naive_triton(*args), expected)
    return compare(tri.paged_attention_decode_triton(*args, num_splits=num_splits), expected)


def _extend_case(args: tuple, expected: torch.Tensor):
    return compare(tri.paged_attention_extend_triton(*args), expected)


def run_checks(quick: bool = False) -> list[dict]:
    rows = []
    print_header()
    torch.manual_seed(0)
    for dtype, d, group, bs, nkv, lens in DECODE_CASES[: 4 if quick else None]:
        k_cache, v_cache, bt, seq_lens = make_paged_kv(lens, nkv, d, bs, dtype)
        query = torch.randn(len(lens), nkv * group, d, device=DEVICE).to(dtype)
        expected = ref.paged_attention_decode_reference(query, k_cache, v_cache, bt, seq_lens,
                                                        d ** -0.5)
        variants = [("split=auto", None), ("split=1", 1), ("split=7", 7), ("split=64", 64),
                    ("naive", "naive")]
        args = (query, k_cache, v_cache, bt, seq_lens, d ** -0.5)
        for name, ns in variants:
            case = functools.partial(_decode_case, args, ns, expected)
            _guard(rows, {"op": "decode", "variant": name, "dtype": DT[dtype], "head_dim": d,
                          "group": group, "block_size": bs, "torch_dtype": dtype,
                          "lens": f"max {max(lens)} n{len(lens)}"}, case)
    for dtype, d, group, bs, nkv, pairs in EXTEND_CASES[: 3 if quick else None]:
        seq_lens_list = [c + q for c, q in pairs]
        k_cache, v_cache, bt, seq_lens = make_paged_kv(seq_lens_list, nkv, d, bs, dtype)
        q_lens = torch.tensor([q for _, q in pairs])
        cu = torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32).to(DEVICE)
        query = torch.randn(int(q_lens.sum()), nkv * group, d, device=DEVICE).to(dtype)
        expected = ref.paged_attention_extend_reference(query, k_cache, v_cache, bt, cu, seq_lens,
                                                        d ** -0.5)
        args = (query, k_cache, v_cache, bt, cu, seq_lens, d ** -0.5)
        case = functools.partial(_extend_case, args, expected)
        _guard(rows, {"op": "extend", "variant": "", "dtype": DT[dtype], "head_dim": d,
                      "group": group, "block_size": bs, "torch_dtype": dtype,
                      "lens": str(pairs)[:40]}, case)
    for row in check_movers():
        rows.append(row)
        print_row(row)
    return rows


def check_movers() -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        k_cache = torch.randn(64, 16, 8, 128, device=DEVICE).to(dtype)
        v_cache = torch.randn_like(k_cache)
        slots = torch.randperm(64 * 16, device=DEVICE)[:300]
        slots[::7] = -1
        key, value = (torch.randn(300, 8, 128, device=DEVICE).to(dtype) for _ in range(2))
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        ref.write_kv_reference(key, value, k_ref, v_ref, slots)
        tri.write_kv_triton(key, value, k_cache, v_cache, slots)
        ok = torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
        mapping = torch.tensor([[1, 9], [2, 63], [40, 0]], device=DEVICE)
        caches = [k_cache.clone() for _ in range(4)]
        expected = [c.clone() for c in caches]
        ref.copy_blocks_reference(expected[:2], expected[2:], mapping)
        tri.copy_blocks_triton(caches[:2], caches[2:], mapping)
        ok_copy = all(torch.equal(a, b) for a, b in zip(caches, expected))
        for op, good in (("write_kv", ok), ("copy_blocks", ok_copy)):
            rows.append({"op": op, "variant": "", "dtype": DT[dtype], "head_dim": 128, "group": 0,
                         "block_size": 16, "lens": "", "rel_err": 0.0 if good else 1.0,
                         "max_abs": 0.0, "nan": False, "ok": good})
    return rows


def print_header() -> None:
    print(f"{'op':11} {'variant':10} {'dtype':5} {'d':>4} {'grp':>3} {'bs':>3} {'lens':42} "
          f"{'rel_err':>9} {'max_abs':>9} result")


def print_row(r: dict) -> None:
    print(f"{r['op']:11} {r['variant']:10} {r['dtype']:5} {r['head_dim']:>4} {r['group']:>3} "
          f"{r['block_size']:>3} {r['lens']:42} {r['rel_err']:9.2e} {r['max_abs']:9.2e} "
          f"{'PASS' if r['ok'] else 'FAIL'}{' NaN' if r['nan'] else ''}")


def print_summary(rows: list[dict]) -> None:
    failed = sum(not r["ok"] for r in rows)
    print(f"attention GPU check: {len(rows) - failed}/{len(rows)} passed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    args = parser.parse_args(argv)
    t0 = time.time()
    rows = run_checks(args.quick)
    print_summary(rows)
    print(f"({time.time() - t0:.1f} s)")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
