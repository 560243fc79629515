"""The boundary between the host-side core (scheduler, KV manager, requests) and the device
side (model runner, sampler, KV cache): what crosses it is plain data (docs/design.md)."""

from __future__ import annotations

import ast
import io
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagedrt import LLM, BeamSearchParams, SamplingParams
from pagedrt.core.request import Request
from pagedrt.engine.model_runner import ModelRunner
from pagedrt.kv.kv_cache import KVCache, KVCacheSpec, kv_bytes_per_block

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 384


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
    for k, v, k_scales, v_scales in cache.layers:
        assert k.shape == v.shape == (5, 8, 1, 16) and k.dtype == torch.float32
        assert k_scales is None and v_scales is None  # scales only in an FP8 cache
    assert cache.cpu_k[0].shape == (3, 8, 1, 16)
    with pytest.raises(ValueError, match="num_kv_heads=0"):
        KVCacheSpec(2, 0, 16, 8, torch.float32)


_SWAP_SCRIPT = """
import random, torch
from tiny_model import build_tiny_llama
from pagedrt import LLM, BeamSearchParams, SamplingParams
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


# --------------------------------------------------------------------------- plans and results
def _workload():
    """Prompts sharing a 16-token prefix (cache hits), n > 1 greedy and seeded samples (forks,
    copy-on-write), logprobs, unseeded sampling; with the engine below also chunked prefill
    and preemption."""
    rng = random.Random(3)
    shared = [rng.randrange(VOCAB) for _ in range(16)]
    prompts = [shared + [rng.randrange(VOCAB) for _ in range(rng.randint(2, 30))]
               for _ in range(10)]
    kinds = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, n=2),
             SamplingParams(temperature=0.8, seed=7, max_tokens=20, ignore_eos=True, n=3),
             SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2),
             SamplingParams(temperature=1.0, top_k=20, max_tokens=16, ignore_eos=True)]
    return prompts, [kinds[i % len(kinds)] for i in range(len(prompts))]


def _llm(tiny, mode: str, **kw) -> LLM:
    return LLM(tiny, num_kv_blocks=40, block_size=8, max_num_batched_tokens=32,
               preemption_mode=mode,
               swap_space_bytes=64 * kv_bytes_per_block(tiny.model_config, 8, torch.float32),
               **kw)


class _NoRequestPickler(pickle.Pickler):
    """Pickles like pickle.dumps, failing on any `Request` inside."""

    def persistent_id(self, obj):
        if isinstance(obj, Request):
            raise TypeError(f"a Request crossed the boundary: {obj}")


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    _NoRequestPickler(buf).dump(obj)
    return buf.getvalue()


def _mirror_runner(engine) -> ModelRunner:
    """A second device side: its own KV cache and rows, the same model and seed."""
    own = engine.model_runner
    cache = KVCache(engine.kv_cache.spec, engine.kv_manager.num_blocks,
                    engine.kv_manager.num_cpu_blocks, engine.device, own.backend)
    return ModelRunner(engine.model, cache, engine.device, own.backend,
                       max_num_seqs=engine.config.max_num_seqs,
                       max_model_len=engine.max_model_len,
                       max_num_batched_tokens=engine.config.max_num_batched_tokens,
                       seed=engine.config.seed)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_plans_and_results_cross_as_plain_data(tiny, scheduling, mode):
    """Every plan and result of real steps (prefill, chunked prefill, decode, prefix hits,
    forks, copy-on-write, preemption by `mode`) pickles with no Request inside and compares
    equal after the round trip; a second model runner driven only by the unpickled plans
    samples exactly the same tokens (and logprobs) as the engine's own."""
    prompts, params = _workload()
    llm = _llm(tiny, mode)
    engine = llm.llm_engine
    runner = engine.model_runner
    mirror = _mirror_runner(engine)
    execute, fetch = runner.execute, runner.fetch
    plans, results, launched = [], [], {}

    def spy_execute(plan, *args, **kwargs):
        data = _dumps(plan)
        received = pickle.loads(data)
        assert received == plan
        plans.append(received)
        step = execute(plan, *args, **kwargs)
        twin = mirror.execute(received)
        assert (step is None) == (twin is None)
        if step is not None:
            launched[id(step)] = twin
        return step

    def spy_fetch(step):
        result = fetch(step)
        received = pickle.loads(_dumps(result))
        assert received == result
        assert mirror.fetch(launched.pop(id(step))) == received
        results.append(received)
        return result

    runner.execute, runner.fetch = spy_execute, spy_fetch
    outs = llm.generate(prompts, params, use_tqdm=False)
    engine.check_integrity()
    assert not launched
    # the workload reached every kind of step
    assert any(n.num_computed_tokens > 0 for p in plans for n in p.new_requests), "no hit"
    assert any(p.forks for p in plans) and any(p.copies.copy for p in plans), "no fork, COW"
    assert any(p.preempted_req_ids for p in plans), "no preemption"
    assert any(n.output_token_ids for p in plans for n in p.new_requests), "no resumption"
    if mode == "swap":
        assert any(p.copies.swap_out for p in plans) and any(p.copies.swap_in for p in plans)
    assert llm.stats()["num_chunked_prefill_steps"] > 0
    assert any(p and all(n == 1 for n in p.num_new_tokens) for p in plans), "no decode step"
    assert any(p.block_changes for p in plans) and any(p.finished_req_ids for p in plans)
    assert any(r.logprobs for r in results)
    # and the outputs are those of an engine with room for everything (no preemption), for
    # the requests whose tokens do not depend on the batch (greedy, seeded)
    ample = LLM(tiny, num_kv_blocks=400, block_size=8).generate(prompts, params,
                                                                 use_tqdm=False)
    fixed = [i for i, p in enumerate(params) if p.greedy or p.seed is not None]
    assert len(fixed) == 8
    assert ([[c.token_ids for c in outs[i].outputs] for i in fixed]
            == [[c.token_ids for c in ample[i].outputs] for i in fixed])


def test_beam_searches_cross_as_plain_data(tiny, scheduling):
    """Beam searches (widths 2 and 4) sharing steps with sampled requests, under preemption:
    plans and results (with every search's candidates) pickle with no Request inside, and a
    second model runner driven only by the unpickled plans expands the same candidates and
    chooses the same slots (its rows, re-parented by the same rule, hold the same tokens)."""
    prompts, params = _workload()
    beams = [BeamSearchParams(beam_width=w, max_tokens=16).to_sampling_params() for w in (2, 4)]
    params = [beams[i % 2] if i % 3 == 0 else p for i, p in enumerate(params)]
    llm = _llm(tiny, "recompute")
    engine = llm.llm_engine
    runner = engine.model_runner
    mirror = _mirror_runner(engine)
    execute, fetch = runner.execute, runner.fetch
    launched, results = {}, []

    def spy_execute(plan, *args, **kwargs):
        received = pickle.loads(_dumps(plan))
        assert received == plan
        step = execute(plan, *args, **kwargs)
        twin = mirror.execute(received)
        if step is not None:
            launched[id(step)] = twin
        return step

    def spy_fetch(step):
        result = fetch(step)
        received = pickle.loads(_dumps(result))
        assert received == result
        assert mirror.fetch(launched.pop(id(step))) == received
        results.append(received)
        return result

    runner.execute, runner.fetch = spy_execute, spy_fetch
    outs = llm.generate(prompts, params, use_tqdm=False)
    engine.check_integrity()
    assert sum(bool(r.beams) for r in results) > 10
    assert llm.stats()["num_preemptions"] > 0
    for row in set(runner.batch.row_of) & set(mirror.batch.row_of):
        assert runner.batch.row_view(row) == mirror.batch.row_view(row)
    ample = LLM(tiny, num_kv_blocks=400, block_size=8).generate(prompts, params,
                                                                 use_tqdm=False)
    for i, p in enumerate(params):
        if p.beam_search is not None or p.greedy or p.seed is not None:
            assert ([c.token_ids for c in outs[i].outputs]
                    == [c.token_ids for c in ample[i].outputs]), i


def test_sync_and_async_scheduling_give_the_same_tokens(tiny):
    """Greedy and seeded requests (whose tokens do not depend on the batch) get the same tokens
    and logprobs with and without async scheduling, through preemption by swap. The two modes
    pack different batches, so a logprob may differ in fp32's last bits (a matmul's sum order
    depends on the batch on some CPUs): tokens and ranks exact, logprobs within 1e-5."""
    prompts, params = _workload()
    fixed = [i for i, p in enumerate(params) if p.greedy or p.seed is not None]
    outs = {}
    for async_scheduling in (False, True):
        llm = _llm(tiny, "swap", async_scheduling=async_scheduling)
        got = llm.generate(prompts, params, use_tqdm=False)
        outs[async_scheduling] = [[(c.token_ids, c.logprobs) for c in got[i].outputs]
                                  for i in fixed]
        assert all(c.logprobs for i in fixed if params[i].logprobs for c in got[i].outputs)
        engine = llm.llm_engine
        # rows of the last requests to finish go with the next plan, even one running nothing
        assert set(engine.model_runner.batch.row_of) <= engine.scheduler.ids_to_drop()
        assert engine.step() == [] and engine.model_runner.batch.row_of == {}
        assert llm.stats()["num_preemptions"] > 0
    for request_async, request_sync in zip(outs[True], outs[False], strict=True):
        for (tokens_a, logprobs_a), (tokens_s, logprobs_s) in zip(request_async, request_sync,
                                                                  strict=True):
            assert tokens_a == tokens_s
            assert (logprobs_a is None) == (logprobs_s is None)
            for a, s in zip(logprobs_a or [], logprobs_s or [], strict=True):
                assert (a.token_id, a.rank) == (s.token_id, s.rank)
                assert [t for t, _ in a.top_logprobs] == [t for t, _ in s.top_logprobs]
                assert abs(a.logprob - s.logprob) <= 1e-5
                for (_, la), (_, ls) in zip(a.top_logprobs, s.top_logprobs, strict=True):
                    assert abs(la - ls) <= 1e-5


def test_device_side_modules_do_not_name_request():
    """The model runner, its rows and the sampler see plans and rows, never a Request."""
    for name in ("model_runner.py", "spec_runner.py", "input_batch.py", "sampler.py",
                 "logits_processors.py", "cuda_graphs.py"):
        tree = ast.parse((ROOT / "pagedrt" / "engine" / name).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.asname or a.name for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "Request" not in names, f"{name} names Request"
