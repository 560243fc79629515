"""Async scheduling: step n+1 is planned and launched before step n's tokens reach the host.

On CPU the model runs synchronously, but the engine's host logic is the same as on CUDA:
placeholders for tokens still being sampled, input ids read on the device from the previous
step's samples, stop checks one step late, rows of stopped or aborted requests dropped, the
penalties counted on the device (no overlap turned off). Every scenario must give the same
tokens as the same run with steps one after the other, and leave no block behind.
(test_scheduler.py and test_prefix_caching.py also run every test in both modes.)
"""

from __future__ import annotations

import random

import pytest

from pagedrt import LLM, SamplingParams
from pagedrt.engine.request import PLACEHOLDER_TOKEN_ID

VOCAB = 384


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def make_llm(model, async_scheduling: bool, **kw) -> LLM:
    kw = {"num_kv_blocks": 256, "block_size": 8, **kw}
    return LLM(model, async_scheduling=async_scheduling, **kw)


def assert_clean(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.check_integrity()
    assert engine.in_flight is None and not engine.has_unfinished_requests()
    assert not engine.requests
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_blocks
    assert all(b.ref_cnt == 0 for b in engine.kv_manager.pool.blocks)


def run_streaming(engine) -> dict[str, list]:
    """Step to the end; request id -> list of (token_ids, finish_reason) of every output.
    Checks that no placeholder ever reaches an output."""
    seen: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for c in out.outputs:
                assert PLACEHOLDER_TOKEN_ID not in c.token_ids, (out.request_id, c.token_ids)
            seen.setdefault(out.request_id, []).append(
                ([list(c.token_ids) for c in out.outputs], out.finished))
    return seen


def final(seen: dict[str, list]) -> dict[str, list]:
    return {rid: outs[-1][0] for rid, outs in seen.items()}


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))] for _ in range(n)]


def test_async_is_on_by_default_only_on_cuda(tiny, monkeypatch):
    monkeypatch.delenv("PAGEDRT_ASYNC_SCHEDULING", raising=False)
    assert LLM(tiny, num_kv_blocks=16).llm_engine.async_scheduling is False
    assert LLM(tiny, num_kv_blocks=16, async_scheduling=True).llm_engine.async_scheduling
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1")
    assert LLM(tiny, num_kv_blocks=16).llm_engine.async_scheduling is True


def test_stop_tokens_hit_while_the_next_step_is_in_flight(tiny):
    """Requests stop on a token id at unpredictable steps: the step launched after that token
    computed one row too many, which must be dropped without touching the other requests."""
    prompts = _prompts(1, 16)
    ref = make_llm(tiny, False).generate(prompts, greedy(24), use_tqdm=False)
    params = [greedy(24, stop_token_ids=[o.outputs[0].token_ids[3 + i % 11]])
              for i, o in enumerate(ref)]
    results = {}
    for mode in (False, True):
        llm = make_llm(tiny, mode)
        for i, (p, sp) in enumerate(zip(prompts, params)):
            llm.llm_engine.add_request(str(i), p, sp)
        results[mode] = run_streaming(llm.llm_engine)
        counters = dict(llm.llm_engine.counters)
        results[mode, "generated"] = counters["num_generated_tokens"]
        assert_clean(llm)
    assert final(results[True]) == final(results[False])
    assert results[True, "generated"] == results[False, "generated"]
    for i, sp in enumerate(params):  # each stopped at the first occurrence of its stop token
        tokens = final(results[True])[str(i)][0]
        assert tokens[-1] == sp.stop_token_ids[0]
        assert sp.stop_token_ids[0] not in tokens[:-1]
    # through LLM.generate, which returns once every request is reported finished: the step
    # launched after the last stop holds only dropped rows and must not be left in flight
    llm = make_llm(tiny, True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert {str(i): [o.outputs[0].token_ids] for i, o in enumerate(outs)} == final(results[True])
    assert_clean(llm)
    # every streamed output is a prefix of the final one, growing one token per report
    for rid, outs in results[True].items():
        lengths = [len(o[0][0]) for o in outs]
        assert lengths == list(range(1, len(lengths) + 1)), (rid, lengths)
        assert [o[1] for o in outs] == [False] * (len(outs) - 1) + [True]


def test_abort_of_a_request_in_the_step_in_flight(tiny):
    prompts = _prompts(2, 6)
    expected = {str(i): o.outputs[0].token_ids for i, o in enumerate(
        make_llm(tiny, False).generate(prompts, greedy(20), use_tqdm=False))}
    llm = make_llm(tiny, True)
    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, greedy(20))
    for _ in range(5):
        engine.step()
    victim = engine.requests["2"]
    assert engine.in_flight is not None and "2" in engine.in_flight.plan.req_ids
    assert victim.num_pending_tokens == 1
    assert engine.abort_request("2")
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    del expected["2"]
    assert done == expected
    assert victim.status.value == "abort" and PLACEHOLDER_TOKEN_ID not in victim.output_token_ids
    assert_clean(llm)


def test_penalties_keep_the_overlap(tiny):
    """Penalties read the generated tokens from counts kept on the device (no host tokens):
    with a step in flight the whole time, greedy and seeded penalized requests give the tokens
    of the run without overlap."""
    prompts = _prompts(3, 8)
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, max_tokens=16 + i,
                             ignore_eos=True, repetition_penalty=1.3 if i % 3 == 0 else 1.0,
                             frequency_penalty=0.5 if i == 4 else 0.0,
                             presence_penalty=-0.7 if i == 5 else 0.0) for i in range(8)]
    outs = {}
    for mode in (False, True):
        llm = make_llm(tiny, mode)
        outs[mode] = [o.outputs[0].token_ids for o in
                      llm.generate(prompts, params, use_tqdm=False)]
        assert_clean(llm)
    assert outs[True] == outs[False]
    # while a penalised request runs, a step stays in flight
    llm = make_llm(tiny, True)
    engine = llm.llm_engine
    engine.add_request("plain", prompts[1], greedy(30))
    engine.step()
    engine.step()
    assert engine.in_flight is not None
    engine.add_request("penalised", prompts[0], params[0])
    num_steps = 0
    while "penalised" in engine.requests:
        engine.step()
        num_steps += 1
        assert engine.in_flight is not None or "penalised" not in engine.requests
    assert num_steps >= params[0].max_tokens
    while engine.has_unfinished_requests():
        engine.step()
    assert_clean(llm)


def test_blocks_filled_by_decodes_are_hashed_with_their_real_tokens(tiny):
    """A block whose last slot was a placeholder when it was scheduled is hashed once its
    token is known: a prompt that repeats prompt + output later hits it in the prefix cache."""
    prompt = _prompts(4, 1)[0][:10]
    llm = make_llm(tiny, True)
    first = llm.generate([prompt], greedy(30), use_tqdm=False)[0].outputs[0].token_ids
    follow = prompt + first[:27]  # 37 tokens: 4 full blocks of 8
    out = llm.generate([follow], greedy(8), use_tqdm=False)[0]
    assert out.num_cached_tokens == 32
    ref = make_llm(tiny, False, enable_prefix_caching=False)
    assert out.outputs[0].token_ids == ref.generate([follow], greedy(8),
                                                    use_tqdm=False)[0].outputs[0].token_ids
    assert_clean(llm)


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_match_the_synchronous_engine(tiny, seed):
    """Random arrivals between steps, stop tokens, n > 1 (greedy and seeded), priorities,
    aborts, a small cache with preemption (recompute or swap): tokens equal to the same
    schedule of events without overlap."""
    rng = random.Random(100 + seed)
    events = []  # (step, kind, payload)
    for i in range(20):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 50))]
        kind = rng.random()
        if kind < 0.2:
            sp = SamplingParams(n=2, temperature=0.9, seed=i, max_tokens=rng.randint(1, 25),
                                ignore_eos=True)
        elif kind < 0.3:
            sp = greedy(rng.randint(1, 25), n=3)
        else:
            sp = greedy(rng.randint(1, 25), stop_token_ids=[rng.randrange(VOCAB)
                                                             for _ in range(6)])
        events.append((rng.randint(0, 30), "add", (str(i), prompt, sp, rng.randint(0, 2))))
    for i in rng.sample(range(20), 3):
        events.append((rng.randint(1, 35), "abort", str(i)))
    events.sort(key=lambda e: (e[0], e[1]))
    mode_kw = {"preemption_mode": rng.choice(["recompute", "swap"]),
               "num_kv_blocks": rng.choice([20, 40, 256]), "max_num_batched_tokens": 48,
               "swap_space_bytes": 1 << 20}
    results = {}
    for mode in (False, True):
        llm = make_llm(tiny, mode, **mode_kw)
        engine = llm.llm_engine
        done, step, pending = {}, 0, list(events)
        while pending or engine.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                _, kind, payload = pending.pop(0)
                if kind == "add":
                    rid, prompt, sp, prio = payload
                    engine.add_request(rid, prompt, sp, priority=prio)
                else:
                    engine.abort_request(payload)
            for out in engine.step():
                for c in out.outputs:
                    assert PLACEHOLDER_TOKEN_ID not in c.token_ids
                if out.finished:
                    done[out.request_id] = [(c.token_ids, c.finish_reason)
                                            for c in out.outputs]
            step += 1
        results[mode] = done
        assert_clean(llm)
    # an abort may land at a different point of a request's life in the two modes (tokens
    # reach the host one step later with overlap): a request aborted in one mode may have
    # completed in the other; every other request completes in both, with the same tokens
    aborted = {e[2] for e in events if e[1] == "abort"}
    for rid in {str(i) for i in range(20)} - aborted:
        assert results[True][rid] == results[False][rid], rid
    for rid in aborted & set(results[True]) & set(results[False]):
        assert results[True][rid] == results[False][rid], rid
