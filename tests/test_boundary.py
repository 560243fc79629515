"""The boundary between the host-side core (scheduler, KV manager, requests) and the device
side (model runner, sampler, KV cache): what crosses it is plain data (docs/design.md)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagedrt.kv.kv_cache import KVCache, KVCacheSpec, kv_bytes_per_block

ROOT = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_kv_imports_nothing_from_engine():
    files = sorted((ROOT / "pagedrt" / "kv").glob("*.py")) + sorted(
        (ROOT / "pagedrt" / "core").glob("*.py"))
    assert len(files) >= 5
    for path in files:
        bad = {m for m in _imported_modules(path) if m.startswith("pagedrt.engine")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_kv_cache_is_built_from_its_spec(tiny_model):
    mc = tiny_model.model_config
    spec = KVCacheSpec.for_model(mc, 8, torch.float16)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (2, 2, 16)
    assert spec.bytes_per_block == 2 * 2 * 8 * 2 * 16 * 2
    assert kv_bytes_per_block(mc, 8, torch.float16) == spec.bytes_per_block
    # one rank's heads: only the spec changes
    half = KVCacheSpec(spec.num_layers, 1, spec.head_dim, 8, torch.float32)
    cache = KVCache(half, num_blocks=5, num_cpu_blocks=3, device=torch.device("cpu"))
    assert len(cache.layers) == 2
    for k, v in cache.layers:
        assert k.shape == v.shape == (5, 8, 1, 16) and k.dtype == torch.float32
    assert cache.cpu_k[0].shape == (3, 8, 1, 16)
    with pytest.raises(ValueError, match="num_kv_heads=0"):
        KVCacheSpec(2, 0, 16, 8, torch.float32)


_SWAP_SCRIPT = """
import random, torch
from tiny_model import build_tiny_llama
from pagedrt import LLM, SamplingParams
from pagedrt.kv.kv_cache import kv_bytes_per_block

assert False, "this script must run under python -O"
tiny = build_tiny_llama(seed=0)
rng = random.Random(5)
prompts = [[rng.randrange(384) for _ in range(rng.randint(20, 40))] for _ in range(12)]
params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ample = LLM(tiny, num_kv_blocks=256, block_size=8).generate(prompts, params, use_tqdm=False)
llm = LLM(tiny, num_kv_blocks=24, block_size=8, max_num_batched_tokens=64,
          preemption_mode="swap",
          swap_space_bytes=64 * kv_bytes_per_block(tiny.model_config, 8, torch.float32))
outs = llm.generate(prompts, params, use_tqdm=False)
s = llm.stats()
kv = llm.llm_engine.kv_manager
if not s["num_swapped_in_blocks"] > 0:
    raise SystemExit(f"no swap-in happened: {s}")
if [o.outputs[0].token_ids for o in outs] != [o.outputs[0].token_ids for o in ample]:
    raise SystemExit("tokens differ from the run without preemption")
if kv.num_free_blocks != kv.num_blocks or kv.req_to_blocks:
    raise SystemExit(f"blocks left in use: {kv.num_free_blocks} of {kv.num_blocks} free")
print("ok", s["num_swapped_in_blocks"])
"""


def test_swap_in_allocates_under_python_O():
    """The swap-in path allocates its slots outside any assert: under `python -O` (asserts
    stripped) swapped requests still get their slots and the same tokens."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               PAGEDRT_ASYNC_SCHEDULING="0", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-O", "-c", _SWAP_SCRIPT], env=env, cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout + proc.stderr
