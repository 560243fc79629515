"""The scheduler's steady decode path (`Scheduler._steady_decode`, `_write_quiet`,
`KVCacheManager.allocate_decode`; docs/design.md, "Host work per step") against the
one-request-at-a-time path it stands in for.

Two engines run the same script of arrivals, aborts and steps, one with the steady path and one
without (`Scheduler.steady_decode = False`). Every step's plan must be identical (token counts,
block ids of every block-table change, copies, forks, finished and preempted ids), and so must
every step's outputs (or token events), the KV manager's prefix-cache counters and the final
tokens; `check_integrity` runs between steps. The workloads reach what the steady path must
leave to the general one or get right: joins and leaves, preemption (recompute and swap),
chunked prefill, prefix hits, n > 1 (copy-on-write of a shared last block), seeded sampling,
logprobs, stop ids, streamed requests, aborts between steps (async: a row finished since its
plan), max_tokens reached with a token in flight, a sliding window, speculative decoding, beam
searches (their slots forked and pruned between steps).
"""

from __future__ import annotations

import copy
import pickle
import random

import pytest
import torch

from pagedrt import LLM, SamplingParams
from pagedrt.kv.kv_cache import kv_bytes_per_block

VOCAB = 384

pytestmark = pytest.mark.usefixtures("scheduling")


def _params(rng: random.Random, i: int) -> SamplingParams:
    kinds = [
        {"temperature": 0.0},
        {"temperature": 0.0, "n": 2},
        {"temperature": 0.8, "seed": i, "n": 3},
        {"temperature": 0.0, "logprobs": 2},
        {"temperature": 1.0, "top_k": 20},
        # stop ids: a greedy run of this model ends early on some of them
        {"temperature": 0.0, "stop_token_ids": [rng.randrange(VOCAB) for _ in range(40)]},
    ]
    return SamplingParams(max_tokens=rng.randint(12, 48), ignore_eos=True,
                          **kinds[i % len(kinds)])


def _script(seed: int, num_requests: int):
    """(step at which it arrives, request id, prompt, params, stream, priority) per request,
    and the steps at which a request is aborted."""
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB) for _ in range(24)]
    arrivals = []
    for i in range(num_requests):
        prompt = ([*shared, *(rng.randrange(VOCAB) for _ in range(rng.randint(1, 20)))]
                  if i % 2 else [rng.randrange(VOCAB) for _ in range(rng.randint(2, 40))])
        step = 0 if i < num_requests // 2 else rng.randint(1, 40)
        arrivals.append((step, f"r{i}", prompt, _params(rng, i), i % 4 == 1, rng.randint(0, 1)))
    aborts = {7: "r3", 15: "r8", 23: f"r{num_requests - 1}"}
    return arrivals, aborts


def _outputs(outs) -> list:
    return [(o.request_id, o.finished,
             [(c.index, c.token_ids, c.finish_reason, c.stop_reason,
               None if c.logprobs is None else repr(c.logprobs)) for c in o.outputs])
            for o in outs]


def _run(make_llm, steady: bool, arrivals, aborts, events: bool = False):
    """Drive an engine through the script; returns (per step: the plan as unpickled plain data
    with the pool's queues after it, and the step's outputs or events; the final tokens;
    prefix-cache counters; the number of plans whose running part took the steady path and
    of tokens `_write_quiet` wrote)."""
    llm = make_llm()
    engine = llm.llm_engine
    scheduler = engine.scheduler
    scheduler.steady_decode = steady
    num_steady = num_quiet = 0
    steady_decode, write_quiet = scheduler._steady_decode, scheduler._write_quiet

    def counting(*args):
        nonlocal num_steady
        result = steady_decode(*args)
        num_steady += result is not None
        return result

    def counting_quiet(*args):
        nonlocal num_quiet
        result = write_quiet(*args)
        num_quiet += result[0]
        return result

    scheduler._steady_decode, scheduler._write_quiet = counting, counting_quiet
    if events:
        engine.token_events = []
    trace, final = [], {}
    step = 0
    while step < 400:
        for at, req_id, prompt, params, stream, priority in arrivals:
            if at == step:
                engine.add_request(req_id, prompt, params, priority=priority, stream=stream)
        if step in aborts:
            engine.abort_request(aborts[step])
        if not engine.has_unfinished_requests() and step > max(a[0] for a in arrivals):
            break
        outs = engine.step()
        # the plan as plain data, and the pool after it (a block given back a step late by
        # a sliding window shows here, not in the plans)
        plan = (pickle.loads(pickle.dumps(engine.last_scheduler_output)),
                list(engine.kv_manager.pool._free_queue),
                list(engine.kv_manager.pool._evictable_queue))
        if events:
            trace.append((plan, list(engine.token_events)))
            engine.token_events.clear()
        else:
            trace.append((plan, _outputs(outs)))
            for o in outs:
                if o.finished:
                    final[o.request_id] = [c.token_ids for c in o.outputs]
        engine.check_integrity()
        step += 1
    assert not engine.has_unfinished_requests()
    kv = engine.kv_manager
    counters = (kv.stats.prefix_cache_queries, kv.stats.prefix_cache_hits,
                kv.stats.num_cow_copies, kv.pool.num_evictions,
                sorted(kv.pool.cached_blocks))
    return trace, final, counters, (num_steady, num_quiet)


def _compare(make_llm, arrivals, aborts, events: bool = False) -> int:
    """Returns the number of steady plans; the steady run must have written some tokens with
    `_write_quiet`."""
    general = _run(make_llm, False, arrivals, aborts, events)
    steady = _run(make_llm, True, arrivals, aborts, events)
    assert general[3] == (0, 0)
    assert steady[3][1] > 0, "no token written by _write_quiet"
    assert len(steady[0]) == len(general[0])
    for n, ((plan, out), (plan_ref, out_ref)) in enumerate(zip(steady[0], general[0])):
        assert plan == plan_ref, f"step {n}: the plans differ"
        assert out == out_ref, f"step {n}: the outputs differ"
    assert steady[1] == general[1]
    assert steady[2] == general[2]
    return steady[3][0]


def _tiny_llm(tiny, **kw):
    def make():
        return LLM(tiny, block_size=8, **kw)
    return make


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_under_memory_pressure(tiny, mode):
    """Preemptions, chunked prefill, prefix hits, forks with copy-on-write, aborts, late
    arrivals, stop ids, streamed requests: the same plans and outputs step by step."""
    arrivals, aborts = _script(seed=1, num_requests=24)
    make = _tiny_llm(tiny, num_kv_blocks=48, max_num_batched_tokens=48, preemption_mode=mode,
                     swap_space_bytes=32 * kv_bytes_per_block(tiny.model_config, 8,
                                                              torch.float32))
    num_steady = _compare(make, arrivals, aborts)
    assert num_steady > 10


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["cache", "nocache"])
def test_with_ample_memory(tiny, prefix_caching):
    """Long steady stretches: most plans take the steady path, with the same result."""
    arrivals, aborts = _script(seed=2, num_requests=16)
    make = _tiny_llm(tiny, num_kv_blocks=400, enable_prefix_caching=prefix_caching)
    num_steady = _compare(make, arrivals, aborts)
    assert num_steady > 20


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "plain"])
def test_token_events(tiny, mixed):
    """The engine core's token-event mode: the same events, in the same order (plain: no
    logprobs, so that most steps write every token in `_write_quiet`)."""
    arrivals, aborts = _script(seed=3, num_requests=16)
    if not mixed:
        arrivals = [(*a[:3], SamplingParams(temperature=a[3].temperature, seed=a[3].seed,
                                            n=a[3].n, max_tokens=a[3].max_tokens,
                                            stop_token_ids=a[3].stop_token_ids,
                                            ignore_eos=True), *a[4:]) for a in arrivals]
    num_steady = _compare(_tiny_llm(tiny, num_kv_blocks=400), arrivals, aborts, events=True)
    assert num_steady > 20


def test_max_tokens_reached_together(tiny):
    """Every request reaches max_tokens in the same step (with async scheduling its last
    token is then in flight while the next plan is made: nothing to schedule)."""
    rng = random.Random(4)
    arrivals = [(0, f"r{i}", [rng.randrange(VOCAB) for _ in range(9)],
                 SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), False, 0)
                for i in range(8)]
    num_steady = _compare(_tiny_llm(tiny, num_kv_blocks=100), arrivals, {})
    assert num_steady > 20


def test_speculative_decoding(tiny):
    """n-gram speculation on while few sequences run (the steady path is off then, and on
    again when the batch grows past disable_by_batch_size)."""
    rng = random.Random(5)
    motif = [rng.randrange(VOCAB) for _ in range(6)]
    arrivals = [(0 if i < 2 else 20, f"r{i}", motif * 4 + [i],
                 SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True), False, 0)
                for i in range(8)]
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4, "disable_by_batch_size": 4}
    num_steady = _compare(_tiny_llm(tiny, num_kv_blocks=200, speculative_config=spec),
                          arrivals, {})
    assert num_steady > 5


@pytest.mark.parametrize("num_kv_blocks", [48, 400], ids=["pressure", "ample"])
def test_beam_search(num_kv_blocks):
    """Beam searches of widths 2 and 4 beside ordinary requests, some ending on EOS (the tiny
    model with two EOS ids): their slots take the steady path too (forks and prunes between
    steps, partial-block copies), with searches preempted whole under pressure."""
    import dataclasses

    from tiny_model import TINY_CONFIG, build_tiny_llama

    from pagedrt import BeamSearchParams

    model = build_tiny_llama(seed=0, config=dataclasses.replace(TINY_CONFIG,
                                                                eos_token_ids=(19, 207)))
    rng = random.Random(7)
    arrivals = []
    for i in range(10):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 30))]
        if i % 3 == 2:
            params = SamplingParams(temperature=0.0, max_tokens=rng.randint(10, 30),
                                    ignore_eos=True)
        else:
            params = BeamSearchParams(beam_width=2 if i % 3 else 4,
                                      max_tokens=rng.randint(10, 30),
                                      ignore_eos=i % 2 == 0).to_sampling_params()
        arrivals.append((0 if i < 6 else rng.randint(1, 20), f"r{i}", prompt, params, False,
                         0))
    make = _tiny_llm(model, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=64)
    num_steady = _compare(make, arrivals, {})
    assert num_steady > 10


def test_sliding_window(tmp_path):
    """A model whose every layer is windowed: blocks leave the cache as the window moves."""
    from test_models_window import _tiny_mistral

    torch.manual_seed(0)
    _tiny_mistral(20).save_pretrained(tmp_path)
    rng = random.Random(6)
    arrivals = [(i // 3, f"r{i}", [rng.randrange(500) for _ in range(rng.randint(5, 50))],
                 SamplingParams(temperature=0.0, max_tokens=rng.randint(20, 40),
                                ignore_eos=True), False, 0)
                for i in range(6)]

    def make():
        return LLM(str(tmp_path), dtype="float32", device="cpu", block_size=8,
                   num_kv_blocks=60)

    num_steady = _compare(make, arrivals, {})
    assert num_steady > 10
    assert make().llm_engine.kv_manager.sliding_window == 20


def _kv_state(kv) -> tuple:
    """Everything of a KV manager that allocations change, as plain values."""
    pool = kv.pool
    return ({k: [b.block_id for b in v] for k, v in kv.req_to_blocks.items()},
            dict(kv._num_cached_blocks), {k: list(v) for k, v in kv._block_hashes.items()},
            dict(kv._changed), list(pool._free_queue), list(pool._evictable_queue),
            {h: sorted(v) for h, v in pool.cached_blocks.items()},
            [(b.ref_cnt, b.block_hash) for b in pool.blocks], kv.pending, kv.stats)


@pytest.mark.parametrize("block_size", [8, 16])
def test_allocate_decode_is_allocate_slots_for_each(tiny, block_size):
    """`allocate_decode` in every steady step leaves the KV manager exactly as
    `allocate_slots(request, 1)` for each request in turn does (replayed on a copy taken
    before): its hints skip only calls that change nothing. Forked samples share partial
    last blocks (copy-on-write) at the start of their decode."""
    llm = LLM(tiny, block_size=block_size, num_kv_blocks=1200)
    engine = llm.llm_engine
    kv = engine.kv_manager
    rng = random.Random(7)
    for i in range(10):
        engine.add_request(f"r{i}", [rng.randrange(VOCAB) for _ in range(rng.randint(3, 30))],
                           SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                                          n=2 if i % 3 == 0 else 1), stream=False)
    allocate_decode = kv.allocate_decode
    num_checked = 0

    def checking(requests, request_ids, ends):
        nonlocal num_checked
        twin, twin_requests = copy.deepcopy((kv, requests))
        done = allocate_decode(requests, request_ids, ends)
        if done:
            for req, end in zip(twin_requests, ends.tolist(), strict=True):
                assert req.num_computed_tokens + 1 == end
                assert twin.allocate_slots(req, 1) is not None
            assert _kv_state(kv) == _kv_state(twin)
            num_checked += 1
        return done

    kv.allocate_decode = checking
    while engine.has_unfinished_requests():
        engine.step()
    assert num_checked > 20

