"""The per-sequence switch-off rule of speculative decoding (pagedrt/spec/acceptance.py): the
pause schedule in isolation (window, backoff 8, 16, 32, ... capped, reset), and in the engine:
a sequence whose drafts are mostly rejected pauses and resumes, its greedy tokens stay those of
plain decoding, no block is held afterwards, paused sequences keep the async overlap, and the
pauses are counted in llm.stats() and /metrics."""

from __future__ import annotations

from itertools import pairwise

import pytest
from test_spec_decode import (
    PROMPTS,
    assert_cache_holds_no_rejected_token,
    assert_no_block_held,
    draft,
    greedy,
    make_llm,
    ngram,
    run,
)
from tiny_model import build_tiny_llama

from pagedrt.spec.acceptance import (
    FIRST_PAUSE_STEPS,
    MAX_PAUSE_STEPS,
    WINDOW,
    AcceptanceRule,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def other_tiny():
    """Other weights, same vocabulary: a draft model that is mostly rejected."""
    return build_tiny_llama(seed=1)


# ------------------------------------------------------------------ the rule alone
def _verify_until_paused(rule: AcceptanceRule, step: int, accepted_length: int = 1) -> int:
    """Record verification steps at `step`, `step` + 1, ... until the rule pauses; returns
    the step id of the last one."""
    for _ in range(WINDOW):
        assert rule.may_speculate("r", step)
        rule.record("r", accepted_length, step)
        if not rule.may_speculate("r", step + 1):
            return step
        step += 1
    raise AssertionError("no pause after a full window")


def test_pauses_double_up_to_the_cap_and_reset_after_a_good_window():
    assert (WINDOW, FIRST_PAUSE_STEPS, MAX_PAUSE_STEPS) == (4, 8, 256)
    rule = AcceptanceRule(2.0)
    step = 10
    pauses = []
    for _ in range(8):
        last = _verify_until_paused(rule, step)
        # paused for exactly the plans last + 1 .. last + pause
        pause = 0
        while not rule.may_speculate("r", last + 1 + pause):
            pause += 1
        pauses.append(pause)
        step = last + 1 + pause
    assert pauses == [8, 16, 32, 64, 128, 256, 256, 256]
    assert rule.num_pauses == 8
    # a window at the bound (mean exactly 2) passes and sets the next pause back to 8
    for length in (1, 3, 2, 2):
        rule.record("r", length, step)
        step += 1
    assert rule.may_speculate("r", step) and rule.num_pauses == 8
    last = _verify_until_paused(rule, step)
    assert rule.may_speculate("r", last + 1 + 8) and not rule.may_speculate("r", last + 8)
    # sequences are independent; a dropped one starts afresh
    assert rule.may_speculate("other", last + 1)
    rule.drop("r")
    assert rule.may_speculate("r", last + 1)


def test_the_window_is_the_latest_steps_and_a_bound_of_one_never_pauses():
    rule = AcceptanceRule(3.0)
    for step, length in enumerate([6, 6, 6, 6, 1, 1]):  # windows 24, 19, 14 >= 3 x 4
        rule.record("r", length, step)
        assert rule.may_speculate("r", step + 1), step
    rule.record("r", 1, 6)  # window 6 1 1 1: 9 < 12
    assert not rule.may_speculate("r", 7) and rule.num_pauses == 1
    for bound in (0, 1.0):
        rule = AcceptanceRule(bound)
        for step in range(50):
            rule.record("r", 1, step)
        assert rule.may_speculate("r", 50) and rule.num_pauses == 0


# ------------------------------------------------------------------ in the engine
def _draft_steps(llm, prompts, params) -> tuple[list, list[list[int]]]:
    """Generate one plan at a time: the outputs, and per request the step ids whose plan gave
    it drafts."""
    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    steps: list[list[int]] = [[] for _ in prompts]
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        engine.check_integrity()
        plan = engine.last_scheduler_output
        for rid in plan.draft_token_ids:
            steps[int(rid)].append(plan.step_id)
    return [outputs[str(i)] for i in range(len(prompts))], steps


def test_a_rejected_draft_model_pauses_and_resumes_with_greedy_tokens_unchanged(
        tiny, other_tiny, monkeypatch):
    """One sequence, a draft model that is mostly rejected, the bound at k + 1 (every window
    that is not fully accepted pauses): after each WINDOW verification steps the sequence
    decodes 8, then 16 steps without drafts, then speculates again; tokens as without
    speculation."""
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "0")
    k = 3
    params = greedy(60)
    base = make_llm(tiny)
    ref = run(base, PROMPTS[1:2], params)
    llm = make_llm(tiny, draft(k, other_tiny, min_mean_accepted_length=k + 1))
    out, (steps,) = _draft_steps(llm, PROMPTS[1:2], params)
    assert out[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
    s = llm.stats()
    assert s["spec_decode_num_pauses"] >= 2
    assert s["spec_decode_acceptance_rate"] < 1.0
    # runs of consecutive speculating steps and the gaps between them
    runs, gaps = [[steps[0]]], []
    for prev, cur in pairwise(steps):
        if cur == prev + 1:
            runs[-1].append(cur)
        else:
            gaps.append(cur - prev - 1)
            runs.append([cur])
    assert [len(r) for r in runs[:2]] == [WINDOW, WINDOW] and gaps[:2] == [8, 16], (runs, gaps)
    assert_no_block_held(llm)
    assert_cache_holds_no_rejected_token(llm, out, base)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ngram_with_the_default_rule_keeps_greedy_tokens(tiny, scheduling, k):
    """The default bound (2.0) on the tiny model, whose own output gives n-gram matches that
    are often wrong: sequences pause and resume in a mixed batch; tokens as without
    speculation, alone and together."""
    base = make_llm(tiny)
    params = greedy(80)
    prompts = [p + p[-6:] * 2 for p in PROMPTS]
    ref = [o.outputs[0].token_ids for o in run(base, prompts, params)]
    llm = make_llm(tiny, ngram(k))
    out = run(llm, prompts, params)
    assert [o.outputs[0].token_ids for o in out] == ref
    s = llm.stats()
    assert s["spec_decode_num_pauses"] > 0 and s["spec_decode_num_draft_tokens"] > 0
    assert_no_block_held(llm)
    assert_cache_holds_no_rejected_token(llm, out, base)
    assert run(llm, prompts[3], params)[0].outputs[0].token_ids == ref[3]
    assert_no_block_held(llm)


def test_a_paused_sequence_keeps_the_async_overlap(tiny, other_tiny, monkeypatch):
    """With async scheduling a draft model makes the engine read every step back before the
    next plan; while the sequence is paused its steps stay in flight again, and the engine
    reads a step early only where a pause ends (the next plan speculates)."""
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1")
    counts = {}
    for bound in (0, 4):
        engine = make_llm(tiny, draft(3, other_tiny, min_mean_accepted_length=bound)).llm_engine
        engine.add_request("r", PROMPTS[1], greedy(60))
        in_flight = 0
        while engine.has_unfinished_requests():
            engine.step()
            in_flight += engine.in_flight is not None
        s = engine.stats()
        counts[bound] = (in_flight, s["spec_decode_num_pauses"], s["spec_decode_num_early_reads"])
    # never paused: only the prefill's step (and one near max_tokens, with no room for
    # drafts) stayed in flight
    assert counts[0][0] <= 2 and counts[0][1] == 0
    in_flight, pauses, early_reads = counts[4]
    assert pauses >= 2 and in_flight >= counts[0][0] + 8 * pauses
    assert early_reads <= pauses + 1  # after the prefill, and where each pause ended


def test_pauses_are_counted_in_stats_and_metrics(tiny, other_tiny):
    from pagedrt.entrypoints.metrics import ServerMetrics

    llm = make_llm(tiny, draft(2, other_tiny, min_mean_accepted_length=3))
    run(llm, PROMPTS[:2], greedy(40))
    stats = llm.llm_engine.stats(detailed=False)
    assert stats["spec_decode_num_pauses"] > 0
    metrics = ServerMetrics()
    metrics.bind(lambda: stats)
    text = metrics.render().decode()
    line = next(x for x in text.splitlines()
                if x.startswith("pagedrt_spec_decode_num_pauses_total "))
    assert float(line.split()[1]) == stats["spec_decode_num_pauses"]
    llm.llm_engine.reset_stats()
    assert llm.stats()["spec_decode_num_pauses"] == 0
    assert "spec_decode_num_pauses" not in make_llm(tiny).stats()
