"""The scheduler under memory pressure: preemption by recompute and swap, chunked prefill,
priorities, rejection of requests that can never fit.

Everything runs on a tiny random-weight Llama (tests/tiny_model.py), greedy in fp32: outputs
must equal a run with ample memory and no chunking, token for token.
"""

from __future__ import annotations

import logging
import random
import re

import pytest
import torch

from pagedrt import LLM, SamplingParams
from pagedrt.kv.kv_cache import kv_bytes_per_block

VOCAB = 384


# every test runs twice: without and with async scheduling (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("scheduling")


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def tokens_of(outs) -> list[list[int]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def assert_clean(llm: LLM) -> None:
    """After a scenario: no request lost or left behind, every block free or cached-evictable,
    the CPU swap pool empty, and every block-manager invariant holds."""
    engine = llm.llm_engine
    engine.check_integrity()
    assert engine.in_flight is None
    sch = engine.scheduler
    assert not (sch.waiting or sch.running or sch.swapped or engine.requests)
    kv = engine.kv_manager
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks), "a block is still in use"
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.num_free_cpu_blocks == kv.num_cpu_blocks and not kv.req_to_cpu_blocks


def run_all(engine) -> dict[str, list[int]]:
    """Step until every request is done; request id -> tokens of its first sample."""
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return done


def swap_bytes(tiny, num_blocks: int, block_size: int) -> int:
    return num_blocks * kv_bytes_per_block(tiny.model_config, block_size, torch.float32)


# --------------------------------------------------------------------------- many requests
def _workload(seed: int):
    """48 requests: random prompts, prompts sharing a system prefix, and identical prompts."""
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(40)]
    prompts, params = [], []
    for i in range(48):
        if i % 3 == 0:
            prompt = system + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
        elif i % 3 == 1:
            prompt = list(system[:33])  # identical prompts: full cache hits
        else:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 60))]
        prompts.append(prompt)
        params.append(greedy(rng.randint(8, 40)))
    return prompts, params


@pytest.fixture(scope="module")
def workload(tiny_model):
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    prompts, params = _workload(seed=0)
    ample = LLM(tiny_model, num_kv_blocks=1024, block_size=8, enable_prefix_caching=False)
    expected = tokens_of(ample.generate(prompts, params, use_tqdm=False))
    assert_clean(ample)
    longest = max(len(p) + q.max_tokens for p, q in zip(prompts, params))
    torch.set_num_threads(num_threads)
    return prompts, params, expected, 3 * -(-longest // 8)


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["cache", "nocache"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_many_requests_in_a_small_cache(tiny, workload, mode, prefix_caching):
    """48 requests in a cache of 3x the blocks of the longest one: all complete, with the same
    tokens as with ample memory, after preemptions."""
    prompts, params, expected, num_blocks = workload
    llm = LLM(tiny, num_kv_blocks=num_blocks, block_size=8, max_num_batched_tokens=64,
              enable_prefix_caching=prefix_caching, preemption_mode=mode,
              swap_space_bytes=swap_bytes(tiny, 64, 8))
    assert tokens_of(llm.generate(prompts, params, use_tqdm=False)) == expected
    s = llm.stats()
    assert s[f"num_preemptions_{mode}"] > 0, s
    assert s["num_finished_requests"] == len(prompts)
    if mode == "swap":
        assert s["num_swapped_out_blocks"] == s["num_swapped_in_blocks"] > 0
    if prefix_caching:
        assert s["prefix_cache_hits"] > 0
    assert_clean(llm)


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full(tiny, workload):
    prompts, params, expected, num_blocks = workload
    llm = LLM(tiny, num_kv_blocks=num_blocks, block_size=8, max_num_batched_tokens=64,
              preemption_mode="swap", swap_space_bytes=swap_bytes(tiny, 4, 8))
    assert tokens_of(llm.generate(prompts, params, use_tqdm=False)) == expected
    s = llm.stats()
    assert s["num_preemptions_swap"] > 0 and s["num_preemptions_recompute"] > 0, s
    assert_clean(llm)


def test_n_samples_and_priorities_under_pressure(tiny):
    """Forked samples (greedy and seeded) and priorities, preempted by recompute and swap:
    the same samples as with ample memory."""
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(5, 30))] for _ in range(12)]
    params = [SamplingParams(n=3, temperature=0.8, seed=i, max_tokens=20, ignore_eos=True)
              if i % 2 else greedy(20, n=2) for i in range(12)]
    priority = [rng.randint(0, 2) for _ in prompts]
    expected = tokens_of(LLM(tiny, num_kv_blocks=512, block_size=8)
                         .generate(prompts, params, use_tqdm=False))
    for mode in ("recompute", "swap"):
        llm = LLM(tiny, num_kv_blocks=24, block_size=8, max_num_batched_tokens=32,
                  preemption_mode=mode, swap_space_bytes=swap_bytes(tiny, 16, 8))
        outs = llm.generate(prompts, params, use_tqdm=False, priority=priority)
        assert tokens_of(outs) == expected
        assert llm.stats()[f"num_preemptions_{mode}"] > 0
        assert_clean(llm)


# --------------------------------------------------------------------------- forced preemption
def force_preempt(engine, request) -> None:
    """Preempt a running request between steps through the scheduler's own path."""
    assert request in engine.scheduler.running, request
    engine.scheduler._preempt(request)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("preempt_at", [[90], [60, 140]], ids=["once", "twice"])
def test_long_generation_preempted_mid_way(tiny, mode, preempt_at):
    """A 3-token prompt generating 200 tokens, preempted mid-way: identical output (so no
    repeated or lost span), finished by max_tokens."""
    prompt = [5, 17, 250]
    reference = LLM(tiny, num_kv_blocks=64).generate([prompt], greedy(200), use_tqdm=False)
    expected = reference[0].outputs[0].token_ids
    assert len(expected) == 200 and len(set(expected)) > 20, "a degenerate reference"

    llm = LLM(tiny, num_kv_blocks=64, preemption_mode=mode,
              swap_space_bytes=swap_bytes(tiny, 16, 16))
    engine = llm.llm_engine
    req = engine.add_request("long", prompt, greedy(200))
    out = None
    while engine.has_unfinished_requests():
        if req.num_output_tokens in preempt_at and req in engine.scheduler.running:
            force_preempt(engine, req)
            assert req.status.value == ("swapped" if mode == "swap" else "waiting")
        for o in engine.step():
            out = o
    assert out.finished and out.outputs[0].finish_reason == "length"
    assert out.outputs[0].token_ids == expected
    assert req.num_preemptions == len(preempt_at)
    s = llm.stats()
    assert s[f"num_preemptions_{mode}"] == len(preempt_at) == s["num_preemptions"]
    if mode == "swap":
        assert s["num_swapped_out_blocks"] == s["num_swapped_in_blocks"] > 0
    else:
        # the recomputed prefix came back from the prefix cache
        assert s["prefix_cache_hits"] >= 16 * (preempt_at[0] // 16)
    assert_clean(llm)


def test_preemption_takes_the_lowest_priority_and_logs_why(tiny, caplog):
    """Under pressure the request with the highest priority value is preempted, whatever
    its arrival order; a log line gives the mode and the reason."""
    llm = LLM(tiny, num_kv_blocks=12, block_size=8)
    engine = llm.llm_engine
    low = engine.add_request("low", list(range(30)), greedy(40), priority=1)
    high = engine.add_request("high", list(range(100, 130)), greedy(40), priority=0)
    with caplog.at_level(logging.INFO, logger="pagedrt.scheduler"):
        run_all(engine)
    assert low.num_preemptions > 0 and high.num_preemptions == 0
    logged = [r.getMessage() for r in caplog.records if "preempted" in r.getMessage()]
    assert logged and all(m.startswith("preempted request 'low' by recompute: no free KV block")
                          for m in logged), logged
    # the blocks it gave back, and the free count after them
    freed, free_now = (int(w) for w in re.search(r"its (\d+) blocks freed \(now (\d+) of 12",
                                                  logged[0]).groups())
    assert 0 < freed <= free_now <= 12
    assert_clean(llm)


def test_request_that_can_never_fit_is_rejected_at_submission(tiny):
    llm = LLM(tiny, num_kv_blocks=8, block_size=8)
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="needs 9 KV blocks but the whole cache has 8 blocks"):
        engine.add_request("big", list(range(40)), greedy(30))
    assert not engine.has_unfinished_requests() and not engine.requests
    # the largest request that fits runs to the end
    assert len(llm.generate([list(range(40))], greedy(24), use_tqdm=False)[0]
               .outputs[0].token_ids) == 24
    assert_clean(llm)


# --------------------------------------------------------------------------- chunked prefill
@pytest.mark.parametrize("chunk", [1, 8, 9], ids=["C=1", "C=bs", "C=bs+1"])
def test_chunked_prefill_matches_unchunked(tiny, chunk, scheduling):
    """Chunk sizes 1, block_size and block_size + 1; prompts of C - 1, C, C + 1 and 2C + 1
    tokens plus longer ones; prompts whose cached prefix ends at C - 1 or C + 1 tokens of a
    cached prompt. Every step schedules at least one token, decodes first, then at least one
    token of a pending prefill unless decodes filled the step."""
    rng = random.Random(chunk)
    warm = [rng.randrange(VOCAB) for _ in range(40)]
    lengths = [n for n in (chunk - 1, chunk, chunk + 1, 2 * chunk + 1, 23, 37) if n > 0]
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in lengths]
    for shared in (chunk - 1, chunk + 1, 16, 17):  # prefixes of the warm prompt, then a tail
        if shared > 0:
            prompts.append(warm[:shared] + [rng.randrange(VOCAB) for _ in range(3)])
    prompts.append(list(warm))
    params = greedy(6)

    ref_llm = LLM(tiny, num_kv_blocks=256, block_size=8, enable_prefix_caching=False)
    expected = tokens_of(ref_llm.generate([warm] + prompts, params, use_tqdm=False))

    llm = LLM(tiny, num_kv_blocks=256, block_size=8, max_num_batched_tokens=chunk)
    engine = llm.llm_engine
    engine.add_request("warm", warm, params)
    done = run_all(engine)  # warm the prefix cache, chunk by chunk
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    while engine.has_unfinished_requests():
        seqs = engine.scheduler.running + engine.scheduler.waiting
        remaining = {r.request_id: r.num_tokens - r.num_computed_tokens for r in seqs}
        prefill_pending = any(n > 1 for n in remaining.values()) or engine.scheduler.waiting
        # with async scheduling, a request whose last token is being sampled has nothing left
        num_schedulable = sum(r.num_output_tokens < r.params.max_tokens or not r.num_pending_tokens
                              for r in seqs)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        sched = engine.last_scheduler_output
        if num_schedulable == 0:
            assert not sched and scheduling == "async"
            continue
        assert sched and all(n >= 1 for n in sched.num_new_tokens)
        assert sched.total_num_tokens <= chunk
        ids = sched.req_ids
        num_decodes = sum(remaining.get(i) == 1 for i in ids)
        if prefill_pending and num_decodes < chunk:
            assert any(remaining.get(i) != 1 for i in ids), (
                f"a step of {chunk} tokens gave {num_decodes} to decodes and none to a prefill")
    got = [[done["warm"]]] + [[done[str(i)]] for i in range(len(prompts))]
    assert got == expected
    s = llm.stats()
    assert s["num_chunked_prefill_steps"] > 0 and s["prefix_cache_hits"] > 0
    assert_clean(llm)


# --------------------------------------------------------------------------- eager padding
@pytest.mark.parametrize("padding", [16, 7])
def test_padded_steps_give_the_same_tokens(tiny, workload, padding):
    """Steps with prompt tokens padded to a multiple of `padding` (what CUDA does with 64, see
    model_runner.EAGER_TOKEN_PADDING): padding rows have slot -1 and belong to no sequence,
    so every request's tokens match the unpadded run, in chunked and mixed steps too."""
    prompts, params, expected, _ = workload
    llm = LLM(tiny, num_kv_blocks=1024, block_size=8, enable_prefix_caching=False,
              max_num_batched_tokens=96)
    runner = llm.llm_engine.model_runner
    runner.token_padding = padding
    sizes = []
    prepare = runner.prepare

    def spy(sched, *a, **kw):
        inputs = prepare(sched, *a, **kw)
        sizes.append((sched.total_num_tokens, len(sched.req_ids), inputs.input_ids.shape[0],
                      inputs.meta.slot_mapping.shape[0]))
        return inputs

    runner.prepare = spy
    assert tokens_of(llm.generate(prompts, params, use_tqdm=False)) == expected
    assert_clean(llm)
    padded = [s for s in sizes if s[2] != s[0]]
    assert padded, "no step was padded"
    for tokens, reqs, ids, slots in sizes:
        if tokens > reqs:  # a step with prompt tokens: padded up to the multiple
            assert ids == slots == -(-tokens // padding) * padding
        else:  # decode-only: never padded
            assert ids == tokens


def test_gemm_warm_up_covers_every_padded_shape(tiny, monkeypatch):
    """warm_up_gemms (run at start-up on CUDA) calls each linear weight shape at every padded
    token count and the LM head at every sampled-row count, the shapes a step with prompt
    tokens can take."""
    import torch.nn.functional as F

    from pagedrt.models.layers import LinearBase

    llm = LLM(tiny, num_kv_blocks=64, block_size=8)
    runner = llm.llm_engine.model_runner
    runner.token_padding = 16
    seen = set()
    linear = F.linear

    def spy(x, w, b=None):
        seen.add((tuple(w.shape), b is not None, x.shape[0]))
        return linear(x, w, b)

    monkeypatch.setattr(F, "linear", spy)
    runner.warm_up_gemms(max_step_tokens=96, max_num_seqs=5)
    assert runner.gemm_warm_up_s > 0
    shapes = {(tuple(m.weight.shape), m.bias is not None) for m in runner.model.modules()
              if isinstance(m, LinearBase)}
    assert {(*shape, m) for shape in shapes for m in range(16, 97, 16)} <= seen
    lm_head = tuple(runner.model.lm_head.weight.shape)
    assert {(lm_head, False, m) for m in range(1, 6)} <= seen


def test_requests_keep_the_attributes_of_init(tiny, monkeypatch):
    """No code path adds an attribute to a Request after __init__ (forks, preemption by swap,
    penalties, logprobs, min_tokens, prefix hits): instances then keep CPython's shared key
    layout, without which every per-request loop of a step ran ~15% slower
    (benchmarks/results/RUNS.md, "What this session changed, and what each change measured")."""
    from pagedrt.engine import request as request_module

    init = request_module.Request.__init__
    created = []

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        created.append((self, frozenset(vars(self))))

    monkeypatch.setattr(request_module.Request, "__init__", recording_init)
    rng = random.Random(9)
    shared = [rng.randrange(VOCAB) for _ in range(16)]  # a common prefix: cache hits
    prompts = [shared + [rng.randrange(VOCAB) for _ in range(rng.randint(3, 20))]
               for _ in range(8)]
    params = [greedy(12, n=2), SamplingParams(temperature=0.7, seed=3, max_tokens=12, n=3),
              greedy(12, repetition_penalty=1.3, presence_penalty=0.5),
              greedy(12, logprobs=2), greedy(12, min_tokens=4)] * 2
    llm = LLM(tiny, num_kv_blocks=20, block_size=8, max_num_batched_tokens=32,
              preemption_mode="swap", swap_space_bytes=swap_bytes(tiny, 16, 8))
    llm.generate(prompts, params[: len(prompts)], use_tqdm=False)
    assert llm.stats()["num_preemptions"] > 0 and llm.stats()["prefix_cache_hits"] > 0
    assert len(created) > len(prompts)  # the forked samples too
    for req, keys in created:
        assert set(vars(req)) == keys, f"{req}: attributes added after __init__: " \
            f"{sorted(set(vars(req)) - keys)}"
    assert_clean(llm)


def test_request_id_in_use_is_rejected(tiny):
    llm = LLM(tiny, num_kv_blocks=64, block_size=8)
    engine = llm.llm_engine
    engine.add_request("x", [1, 2, 3], greedy(4))
    for add in (lambda: engine.add_request("x", [4, 5], greedy(4)),
                lambda: engine.add_validated_request("x", [4, 5], greedy(4))):
        with pytest.raises(ValueError, match="request_id 'x' is already in use"):
            add()
    assert len(engine.scheduler.waiting) == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert_clean(llm)
