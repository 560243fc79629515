"""Speculative decoding on the tiny model and in isolation: configuration, n-gram lookup, the
rejection sampler's distribution (chi-square, with wrong rules that must fail it), and the
engine with drafts: greedy tokens identical to no speculation, a draft model equal to the
target accepted every time, seeded sampling reproducible, stops and logprobs exact with several
tokens per step, token events, the switch-off rule, async scheduling, and after every scenario
no block held and no cached block holding a rejected token."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_model import build_tiny_llama

from pagedrt import LLM, EngineConfig, SamplingParams
from pagedrt.core.plan import NewRequestData, StepPlan
from pagedrt.engine.sampler import SamplingRow
from pagedrt.entrypoints.engine_args import add_engine_config_args, engine_kwargs
from pagedrt.kv.block_pool import hash_token_blocks, root_hash
from pagedrt.kv.kv_cache import KVCache, KVCacheSpec
from pagedrt.ops.attention import AttentionMetadata
from pagedrt.spec import rejection_sampler as rs
from pagedrt.spec.config import SpeculativeConfig
from pagedrt.spec.ngram import BULK_MIN_TOKENS, NgramIndex, NgramProposer

BLOCK = 8


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def ngram(k: int, lo: int = 1, hi: int = 3, **kw) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
            "prompt_lookup_max": hi, **kw}


def draft(k: int, model, **kw) -> dict:
    return {"method": "draft_model", "num_speculative_tokens": k, "model": model, **kw}


def make_llm(model, spec: dict | None = None, **kw) -> LLM:
    return LLM(model, **{"num_kv_blocks": 160, "block_size": BLOCK, "speculative_config": spec,
                         **kw})


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def run(llm: LLM, prompts, params) -> list:
    """Generate, checking the engine's invariants after every step."""
    engine = llm.llm_engine
    original = engine.step

    def checked_step():
        out = original()
        engine.check_integrity()
        return out

    engine.step = checked_step
    try:
        return llm.generate(prompts, params, use_tqdm=False)
    finally:
        del engine.step


def assert_no_block_held(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.check_integrity()
    assert not engine.has_unfinished_requests() and engine.in_flight is None
    usage = engine.kv_manager.usage()
    assert usage["num_used_blocks"] == 0, usage
    assert all(b.ref_cnt == 0 for b in engine.kv_manager.pool.blocks)


def cached_blocks(llm: LLM) -> dict[bytes, list[torch.Tensor]]:
    """hash -> the K and V of every layer of a cached block holding it."""
    engine = llm.llm_engine
    out = {}
    for block in engine.kv_manager.pool.blocks:
        if block.block_hash is not None:
            out[block.block_hash] = [c[block.block_id].clone() for c in
                                     engine.kv_cache.k_caches + engine.kv_cache.v_caches]
    return out


def true_hashes(outputs, block_size: int) -> set[bytes]:
    """Hashes of every full block of every finished sequence's real tokens."""
    hashes = set()
    for out in outputs:
        for c in out.outputs:
            tokens = np.asarray(out.prompt_token_ids + list(c.token_ids), dtype=np.int64)
            full = len(tokens) // block_size * block_size
            hashes.update(hash_token_blocks(root_hash(), tokens[:full], block_size))
    return hashes


def assert_cache_holds_no_rejected_token(spec_llm: LLM, spec_outputs, base_llm: LLM) -> None:
    """Every cached block's hash is that of a prefix of real tokens, and a block cached in both
    runs holds the same K/V (up to the round-off of another attention path)."""
    spec_cache, base_cache = cached_blocks(spec_llm), cached_blocks(base_llm)
    assert spec_cache, "nothing cached"
    assert set(spec_cache) <= true_hashes(spec_outputs,
                                          spec_llm.llm_engine.kv_manager.block_size)
    common = set(spec_cache) & set(base_cache)
    assert len(common) >= len(spec_cache) // 2, (len(common), len(spec_cache))
    for h in common:
        for a, b in zip(spec_cache[h], base_cache[h]):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ configuration
def test_config_names_defaults_and_errors():
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (c.prompt_lookup_min, c.prompt_lookup_max, c.disable_by_batch_size) == (5, 5, 4)
    assert c.min_mean_accepted_length == 2.0
    assert SpeculativeConfig.from_dict(ngram(3, min_mean_accepted_length=4)).to_dict()[
        "min_mean_accepted_length"] == 4
    c = SpeculativeConfig.from_dict(ngram(3, lo=None, hi=4))
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (4, 4)
    bad = [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
        # an unknown method is named even without the other keys (a fresh user's finding)
        ({"method": "bogus"}, "method='bogus'; use one of 'ngram', 'draft_model'"),
        ({"num_speculative_tokens": 2}, "needs 'method'"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        (ngram(2, lo=4, hi=2), "prompt_lookup_min"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "lookahead"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
        (ngram(2, disable_by_batch_size=0), "disable_by_batch_size"),
        (ngram(2, min_mean_accepted_length=3.5), r"min_mean_accepted_length=3\.5 .*\[0, 3\]"),
        (ngram(2, min_mean_accepted_length=-1), "min_mean_accepted_length"),
        (ngram(2, min_mean_accepted_length=float("nan")), "min_mean_accepted_length"),
        (ngram(2, min_mean_accepted_length="2"), "min_mean_accepted_length"),
        (ngram(2, min_mean_accepted_length=True), "min_mean_accepted_length"),
        ("ngram", "dict"),
    ]
    for value, word in bad:
        with pytest.raises(ValueError, match=word):
            EngineConfig(speculative_config=value)


def test_command_line_takes_a_json_object():
    p = argparse.ArgumentParser()
    add_engine_config_args(p)
    args = p.parse_args(["--speculative-config",
                         '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert engine_kwargs(args)["speculative_config"] == {"method": "ngram",
                                                         "num_speculative_tokens": 4}
    assert engine_kwargs(p.parse_args([]))["speculative_config"] is None
    with pytest.raises(SystemExit):
        p.parse_args(["--speculative-config", "[1, 2]"])


# ------------------------------------------------------------------ n-gram lookup
def test_ngram_index_longest_match_first_occurrence():
    idx = NgramIndex(1, 3)
    idx.extend([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3])
    # "1 2 3" (n = 3) first ended at position 2: the tokens after it
    assert idx.propose(3) == [4, 5, 9]
    idx.extend([6])  # "3 6" / "6" never seen
    assert idx.propose(3) == []
    idx.extend([2, 3])  # n = 3 "6 2 3" unseen, n = 2 "2 3" first ended at 2
    assert idx.propose(2) == [4, 5]
    idx = NgramIndex(2, 2)
    idx.extend([5, 5, 5])  # "5 5" first ended at 1: one token after it so far
    assert idx.propose(4) == [5]
    idx = NgramIndex(1, 1)
    idx.extend([7])
    assert idx.propose(2) == []  # no room for an earlier occurrence


def test_ngram_index_extends_incrementally():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, 200).tolist()
    whole = NgramIndex(2, 4)
    whole.extend(tokens)
    parts = NgramIndex(2, 4)
    for i in range(0, 200, 7):
        parts.extend(tokens[i:i + 7])
    assert parts.first_end == whole.first_end and parts.propose(5) == whole.propose(5)
    # the brute force: the longest n whose last-n tokens occurred earlier, first occurrence
    for n in range(4, 1, -1):
        suffix = tokens[-n:]
        ends = [e for e in range(n - 1, len(tokens) - 1) if tokens[e - n + 1:e + 1] == suffix]
        if ends:
            assert whole.propose(5) == tokens[ends[0] + 1: ends[0] + 6]
            break


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(0, 300), vocab=st.integers(1, 8),
       min_n=st.integers(1, 4), extra_n=st.integers(0, 3))
def test_bulk_index_proposes_what_the_token_by_token_index_did(seed, length, vocab, min_n,
                                                                extra_n):
    """Random sequences over a few ids (many repeats), indexed in random chunks (one-pass
    chunks of >= BULK_MIN_TOKENS, before and after others, and token-by-token ones) against
    one token at a time: the same table and, after every chunk, the same proposals."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, length).tolist()
    one_by_one = NgramIndex(min_n, min_n + extra_n)
    chunked = NgramIndex(min_n, min_n + extra_n)
    i = num_bulk = 0
    while i < len(tokens):
        size = int(rng.choice([1, 2, 5, BULK_MIN_TOKENS, 40, 120]))
        num_bulk += size >= BULK_MIN_TOKENS and i + 1 < len(tokens)
        for token in tokens[i:i + size]:
            one_by_one.extend([token])
        chunked.extend(tokens[i:i + size])
        i += size
        assert chunked.tokens == one_by_one.tokens
        assert chunked.first_end == one_by_one.first_end
        for max_num in (1, 3, 8):
            assert chunked.propose(max_num) == one_by_one.propose(max_num)
    assert length < 100 or num_bulk  # (with 6 sizes, a long sequence has a one-pass chunk)


def test_first_speculation_indexes_the_prompt_in_one_pass(monkeypatch):
    """A sequence's first proposal indexes its whole prompt and output in one bulk pass; the
    tokens of later steps are added one by one."""
    from pagedrt.core.request import Request

    calls = []
    bulk = NgramIndex._extend_bulk
    monkeypatch.setattr(NgramIndex, "_extend_bulk",
                        lambda self, new: (calls.append(len(new)), bulk(self, new))[1])
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 50, 300).tolist()
    req = Request("r", prompt + prompt[:20], SamplingParams(max_tokens=64))
    req.output_token_ids.extend(prompt[20:23])
    proposer = NgramProposer(5, 2, 4)
    assert proposer.propose(req, 5) == prompt[23:28]
    assert calls == [323]
    req.output_token_ids.extend(prompt[23:26])
    assert proposer.propose(req, 5) == prompt[26:31]
    assert calls == [323] and BULK_MIN_TOKENS > 3


# ------------------------------------------------------------------ rejection sampler
def _chi2_bound(df: int, z: float = 3.719) -> float:
    """Upper chi-square quantile (Wilson-Hilferty; z = 3.719: one-sided 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(observed: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson statistic over bins with expected count >= 5 (the rest pooled), and its df."""
    n = observed.sum()
    expected = probs * n
    big = expected >= 5
    obs = list(observed[big]) + ([observed[~big].sum()] if (~big).any() else [])
    exp = list(expected[big]) + ([expected[~big].sum()] if (~big).any() else [])
    obs, exp = np.asarray(obs, float), np.asarray(exp, float)
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def _verify_many(num: int, seed: int = 0):
    """One verification of the same 2 drafts over `num` identical rows (temperature 1):
    the output tokens [num, 3], their counts [num], and the target's distributions p_0..p_2."""
    g = torch.Generator().manual_seed(123)
    logits = torch.randn(3, 6, generator=g) * 1.5  # 3 positions, vocabulary of 6
    drafts = torch.tensor([[int(logits[0].argsort()[-2]), int(logits[1].argsort()[-3])]])
    rows = [SamplingRow(SamplingParams(temperature=1.0))] * num
    out = rs.RejectionSampler()(logits.expand(num, 3, 6), rows, drafts.expand(num, 2).clone(),
                                [2] * num, torch.Generator().manual_seed(seed))
    probs = torch.softmax(logits, -1).numpy().astype(np.float64)
    return out.token_ids.numpy(), out.num_tokens.numpy(), probs, drafts[0].tolist()


def _rejection_statistics(num: int = 30000) -> list[tuple[float, int]]:
    """Chi-square of the first token against p_0, of the second (where the first draft was
    accepted) against p_1, and of the third (both accepted) against p_2."""
    tokens, counts, probs, _ = _verify_many(num)
    return [_chi2(np.bincount(tokens[counts > t, t], minlength=6), probs[t]) for t in range(3)]


def test_rejection_sampling_keeps_the_target_distribution():
    tokens, counts, _, (d1, d2) = _verify_many(2000)
    # a draft is accepted exactly when the output repeats it, and only then does more follow
    assert ((counts >= 2) == (tokens[:, 0] == d1)).all()
    assert ((counts == 3) == ((counts >= 2) & (tokens[:, 1] == d2))).all()
    for stat, df in _rejection_statistics():
        assert stat < _chi2_bound(df), (stat, df)


@pytest.mark.parametrize("wrong", ["accept_always", "resample_from_p"])
def test_a_wrong_acceptance_rule_fails_the_same_bound(wrong, monkeypatch):
    real = rs._sample

    def broken(processed, position_rows, rows, drafts, num_drafts, valid, gen, width):
        if wrong == "resample_from_p":  # after a rejection, draw from p, not p minus the draft
            return real(processed, position_rows, rows, drafts, num_drafts,
                        torch.zeros_like(valid), gen, width)
        accept, candidate = real(processed, position_rows, rows, drafts, num_drafts, valid,
                                 gen, width)
        return torch.ones_like(accept), candidate

    monkeypatch.setattr(rs, "_sample", broken)
    assert any(stat > _chi2_bound(df) for stat, df in _rejection_statistics())


def test_greedy_verification_is_the_longest_agreeing_prefix_then_the_argmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 4, 10, generator=g)
    target = logits.argmax(-1)  # [4 rows, 4 positions]
    drafts = target[:, :3].clone()
    drafts[1, 0] += 1  # row 1: first draft wrong
    drafts[2, 2] = (drafts[2, 2] + 1) % 10  # row 2: third wrong
    num = [3, 3, 3, 2]  # row 3: only two drafts
    rows = [SamplingRow(SamplingParams(temperature=0.0))] * 4
    out = rs.RejectionSampler()(logits, rows, drafts % 10, num)
    assert out.num_tokens.tolist() == [4, 1, 3, 3]
    assert out.token_ids[0].tolist() == target[0].tolist()
    assert out.token_ids[1, 0] == target[1, 0]
    assert out.token_ids[2, :3].tolist() == target[2, :3].tolist()
    assert out.token_ids[3, :3].tolist() == target[3, :3].tolist()
    with pytest.raises(ValueError, match="num_drafts"):
        rs.RejectionSampler()(logits, rows, drafts, [4, 0, 0, 0])


def _general_path(logits, rows, drafts, num, monkeypatch):
    """The RejectionSampler's output through its general path (the plain-greedy check off)."""
    with monkeypatch.context() as m:
        m.setattr(rs, "plain_greedy", lambda params: False)
        return rs.RejectionSampler()(logits, rows, drafts, num)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_plain_greedy_path_gives_the_general_paths_output(dtype, seed, monkeypatch):
    """All rows plain greedy: the short path (no float32 copy, no processed logits) gives the
    general path's num_tokens and token_ids up to them, on random logits with many ties
    (integers in a small range; bf16 rounds more of them together), drafts agreeing for a
    random prefix, rows with every draft, fewer, or none."""
    g = torch.Generator().manual_seed(seed)
    num_rows, k, vocab = 6, 5, 12
    logits = (torch.randint(-3, 4, (num_rows, k + 1, vocab), generator=g).float()
              + 0.01 * torch.randn(num_rows, k + 1, vocab, generator=g)).to(dtype)
    logits[0, :, 3:6] = logits[0].max()  # row 0: a three-way tie at every position
    target = logits.float().argmax(-1)
    drafts = target[:, :k].clone()
    agree = torch.randint(0, k + 1, (num_rows,), generator=g)  # drafts right up to here
    for s, a in enumerate(agree.tolist()):
        drafts[s, a:] = (drafts[s, a:] + 1 + torch.randint(0, vocab - 1, (k - a,),
                                                           generator=g)) % vocab
    rows = [SamplingRow(SamplingParams(temperature=0.0))] * num_rows
    for num in ([k] * num_rows, [k, 3, 0, k, 1, 2]):
        monkeypatch.setattr(rs, "processed_logits", None)  # the short path must not call it
        fast = rs.RejectionSampler()(logits, rows, drafts, num)
        monkeypatch.undo()
        ref = _general_path(logits, rows, drafts, num, monkeypatch)
        expected = [1 + min(a, j) for a, j in zip(agree.tolist(), num)]
        assert fast.num_tokens.tolist() == ref.num_tokens.tolist() == expected
        assert fast.token_ids.dtype == ref.token_ids.dtype == torch.int64
        for s, n in enumerate(expected):
            assert fast.token_ids[s, :n].tolist() == ref.token_ids[s, :n].tolist()
            assert fast.token_ids[s, n - 1] == target[s, n - 1]
        assert fast.logprobs is None


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, logprobs=1),
    SamplingParams(temperature=0.0, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, min_tokens=3),
])
def test_greedy_rows_that_read_the_logits_take_the_general_path(params, monkeypatch):
    """Logprobs, penalties and min_tokens need the processed float32 logits: such rows (even
    greedy) never take the short path."""
    calls = []
    general = rs.processed_logits
    monkeypatch.setattr(rs, "processed_logits",
                        lambda raw, rows: calls.append(1) or general(raw, rows))
    logits = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    rows = [SamplingRow(SamplingParams(temperature=0.0)),
            SamplingRow(params, None, [1, 2], [3], (0,))]
    out = rs.RejectionSampler()(logits, rows, torch.zeros(2, 2, dtype=torch.int64), [2, 2])
    assert calls == [1]
    assert (out.logprobs is not None) == (params.logprobs is not None)


# ------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def other_tiny():
    """A second tiny model (other weights, same vocabulary): a draft that often disagrees."""
    return build_tiny_llama(seed=1)


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8] * 3, list(range(10, 47)), [5, 9] * 6 + [11, 12, 13], [3]]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_equal_to_target_accepts_every_draft(tiny, scheduling, k):
    base = make_llm(tiny)
    params = [greedy(21), greedy(30), greedy(17, stop_token_ids=[0]), greedy(9)]
    ref = run(base, PROMPTS, params)
    llm = make_llm(tiny, draft(k, tiny))
    out = run(llm, PROMPTS, params)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref]
    s = llm.stats()
    assert s["spec_decode_num_draft_tokens"] > 0
    assert s["spec_decode_acceptance_rate"] == 1.0
    assert s["spec_decode_num_accepted_tokens"] == s["spec_decode_num_draft_tokens"]
    assert s["spec_decode_mean_accepted_length"] > 1 + 0.5 * k
    assert s["num_generated_tokens"] == sum(len(o.outputs[0].token_ids) for o in out)
    assert_no_block_held(llm)
    assert_cache_holds_no_rejected_token(llm, out, base)


@pytest.mark.parametrize("k", [2, 5])
def test_disagreeing_draft_rolls_back_and_keeps_greedy_tokens(tiny, other_tiny, scheduling, k):
    """Most drafts rejected: every step rolls back, blocks of rejected slots are freed, and the
    tokens are still those of plain greedy decoding; with preemption in a small cache too.
    (The per-sequence rule is off, so that every step verifies drafts.)"""
    base = make_llm(tiny)
    params = greedy(26)
    ref = [o.outputs[0].token_ids for o in run(base, PROMPTS, params)]
    for blocks in (160, 14):
        llm = make_llm(tiny, draft(k, other_tiny, min_mean_accepted_length=0),
                       num_kv_blocks=blocks)
        out = run(llm, PROMPTS, params)
        assert [o.outputs[0].token_ids for o in out] == ref
        s = llm.stats()
        assert 0 < s["spec_decode_num_accepted_tokens"] < s["spec_decode_num_draft_tokens"]
        if blocks == 14:
            assert s["num_preemptions"] > 0
        assert_no_block_held(llm)
        assert_cache_holds_no_rejected_token(llm, out, base)


def test_runner_tokens_right_with_verification_and_plain_steps_in_flight_together(tiny):
    """The model runner's host buffers (`_token_buffers`, used in turn): a verification step
    and a plain step launched one after the other and fetched afterwards (one step in flight
    while the next launches, as with async scheduling), in both orders, then a step where
    both rows verify different numbers of drafts and a step that mixes a verifying and a
    plain row. Every token must be plain greedy decoding's, with the accepted counts the
    drafts allow (a buffer reused too early gives another step's tokens)."""
    prompts = {"a": list(range(10, 20)), "b": [5, 9] * 5}
    ref = dict(zip(prompts, (o.outputs[0].token_ids for o in run(
        make_llm(tiny), list(prompts.values()), greedy(12)))))
    runner = make_llm(tiny, ngram(3)).llm_engine.executor.model_runner
    gen: dict[str, list[int]] = {"a": [], "b": []}
    step_ids = iter(range(1000, 2000))

    def plan(steps: dict[str, list[int] | None]) -> StepPlan:
        req_ids = list(steps)
        return StepPlan(
            step_id=next(step_ids), req_ids=req_ids,
            num_new_tokens=[1 + len(steps[r] or ()) for r in req_ids],
            num_computed_tokens=[len(prompts[r]) + len(gen[r]) - 1 for r in req_ids],
            draft_token_ids={r: d for r, d in steps.items() if d})

    def take(result) -> None:
        for r, token in zip(result.req_ids, result.sampled_token_ids):
            gen[r] += [token, *result.extra_token_ids.get(r, [])]

    def drafts(r: str, num_right: int, num_wrong: int) -> list[int]:
        right = ref[r][len(gen[r]): len(gen[r]) + num_right + num_wrong]
        return right[:num_right] + [t ^ 1 for t in right[num_right:]]

    take(runner.fetch(runner.execute(StepPlan(
        step_id=next(step_ids), req_ids=["a", "b"], num_new_tokens=[10, 10],
        num_computed_tokens=[0, 0],
        new_requests=[NewRequestData(r, prompts[r], [], greedy(12), 0, (),
                                     list(range(1 + 4 * i, 5 + 4 * i)), 0)
                      for i, r in enumerate(prompts)]))))
    # verification then plain, in flight together; then plain then verification
    # a verification step, then a plain one launched before the first is fetched
    first = runner.execute(plan({"a": drafts("a", 3, 0)}))
    second = runner.execute(plan({"b": None}))
    take(runner.fetch(first))
    take(runner.fetch(second))
    # a plain step, then a verification step
    first = runner.execute(plan({"a": None}))
    second = runner.execute(plan({"b": drafts("b", 1, 2)}))
    take(runner.fetch(first))
    take(runner.fetch(second))
    assert [len(gen["a"]), len(gen["b"])] == [6, 4]
    # both verify (3 and 1 drafts: the logits gathered per row), then one plain beside one
    take(runner.fetch(runner.execute(plan({"a": drafts("a", 2, 1), "b": drafts("b", 0, 1)}))))
    take(runner.fetch(runner.execute(plan({"a": drafts("a", 1, 2), "b": None}))))
    assert [len(gen["a"]), len(gen["b"])] == [11, 6]
    assert gen == {r: ref[r][: len(gen[r])] for r in prompts}


def test_ngram_on_a_model_that_repeats(tiny, scheduling):
    """The tiny model copies nothing, so drafts come from n-grams of its own output and the
    prompt; greedy tokens must not change, alone and mixed with requests without matches."""
    base = make_llm(tiny)
    params = greedy(40)
    ref = [o.outputs[0].token_ids for o in run(base, PROMPTS, params)]
    for k in (1, 3, 5):
        llm = make_llm(tiny, ngram(k))
        out = run(llm, PROMPTS, params)
        assert [o.outputs[0].token_ids for o in out] == ref
        assert llm.stats()["spec_decode_num_draft_tokens"] > 0
        assert_no_block_held(llm)
        assert_cache_holds_no_rejected_token(llm, out, base)
        alone = run(llm, PROMPTS[2], params)[0].outputs[0].token_ids
        assert alone == ref[2]


def test_stops_max_tokens_and_logprobs_exact_with_several_tokens_per_step(tiny, scheduling):
    """With every draft accepted, steps add up to k + 1 tokens: a stop token id inside them
    ends the request there, max_tokens is never passed, and the logprobs of every token equal
    those of plain decoding."""
    base = make_llm(tiny)
    ref = run(base, PROMPTS, greedy(30))
    stop_ids = [o.outputs[0].token_ids[5 + i] for i, o in enumerate(ref)]
    params = [greedy(30, stop_token_ids=[stop_ids[0]], logprobs=2),
              greedy(13, logprobs=0), greedy(30, stop_token_ids=[stop_ids[2]]),
              SamplingParams(temperature=0.0, max_tokens=7, logprobs=1)]
    expected = run(base, PROMPTS, params)
    llm = make_llm(tiny, draft(4, tiny))
    out = run(llm, PROMPTS, params)
    for a, b, p in zip(out, expected, params):
        ca, cb = a.outputs[0], b.outputs[0]
        assert ca.token_ids == cb.token_ids and ca.finish_reason == cb.finish_reason
        assert ca.stop_reason == cb.stop_reason
        assert len(ca.token_ids) <= p.max_tokens
        if p.logprobs is not None:
            assert len(ca.logprobs) == len(ca.token_ids)
            for la, lb in zip(ca.logprobs, cb.logprobs):
                assert la.token_id == lb.token_id and la.rank == lb.rank
                assert la.logprob == pytest.approx(lb.logprob, abs=1e-4)
                assert [t for t, _ in la.top_logprobs] == [t for t, _ in lb.top_logprobs]
    assert out[0].outputs[0].token_ids[-1] == stop_ids[0]
    assert llm.stats()["spec_decode_mean_accepted_length"] > 3
    assert_no_block_held(llm)


def test_seeded_sampling_is_reproducible(tiny, scheduling):
    params = [SamplingParams(temperature=1.0, seed=11 + i, max_tokens=24, ignore_eos=True,
                             top_k=50 if i % 2 else -1, n=1 + (i == 1))
              for i in range(len(PROMPTS))]
    # both switch-off rules off (5 sequences): every step verifies drafts. The target as its
    # own greedy draft: at temperature 1 about a quarter of the drafts are accepted (another
    # model's drafts almost never are), so both acceptances and rejections occur
    spec = draft(3, tiny, min_mean_accepted_length=0, disable_by_batch_size=8)
    runs = []
    for _ in range(2):
        llm = make_llm(tiny, spec)
        runs.append([[c.token_ids for c in o.outputs] for o in run(llm, PROMPTS, params)])
        assert llm.stats()["spec_decode_num_accepted_tokens"] > 0
        assert_no_block_held(llm)
    assert runs[0] == runs[1]
    # a seeded request's tokens do not depend on what runs beside it
    llm = make_llm(tiny, spec)
    alone = run(llm, PROMPTS[2], params[2])[0].outputs[0].token_ids
    assert alone == runs[0][2][0]


def test_token_events_carry_every_accepted_token(tiny, scheduling):
    """The engine core's mode: one TokenEvent per token, several per step for a request."""
    params = [greedy(20), greedy(25, stop_token_ids=[0]), greedy(11), greedy(6)]
    ref = run(make_llm(tiny), PROMPTS, params)
    engine = make_llm(tiny, draft(3, tiny)).llm_engine
    events: list = []
    engine.token_events = events
    for i, (p, sp) in enumerate(zip(PROMPTS, params)):
        engine.add_validated_request(str(i), p, sp)
    got: dict[str, list[int]] = {}
    finish: dict[str, str] = {}
    most_in_a_step = 0
    while engine.has_unfinished_requests():
        assert engine.step() == []
        per_request: dict[str, int] = {}
        for e in events:
            assert e.request_id not in finish
            got.setdefault(e.request_id, []).append(e.token_id)
            per_request[e.request_id] = per_request.get(e.request_id, 0) + 1
            if e.finish_reason is not None:
                finish[e.request_id] = e.finish_reason
        most_in_a_step = max(most_in_a_step, *per_request.values(), 0)
        events.clear()
    assert got == {str(i): o.outputs[0].token_ids for i, o in enumerate(ref)}
    assert finish == {str(i): o.outputs[0].finish_reason for i, o in enumerate(ref)}
    # k + 1 = 4 per verification step (with async scheduling the step read back first may
    # add the token before them in the same call)
    assert most_in_a_step == (4 if scheduling == "sync" else 5) and not engine.requests


def test_bursts_above_the_batch_bound_and_speculation_within_it(tiny):
    """Speculation configured (a draft model, off above 2 sequences) and multi-step decode on
    (4 passes): while 3 sequences run their steady plans burst, from 2 on they speculate,
    never both in one plan; every token the plain one-pass engine gives."""
    params = [greedy(6 + 12 * i) for i in range(3)]
    expected = make_llm(tiny).generate(PROMPTS[:3], params, use_tqdm=False)
    engine = make_llm(tiny, draft(3, tiny, disable_by_batch_size=2),
                      num_scheduler_steps=4).llm_engine
    for i, (p, sp) in enumerate(zip(PROMPTS[:3], params)):
        engine.add_request(str(i), p, sp)
    seen, final = [], {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
        plan = engine.last_scheduler_output
        seen.append((plan.num_steps, bool(plan.draft_token_ids)))
    assert [final[str(i)] for i in range(3)] == [o.outputs[0].token_ids for o in expected]
    assert any(steps > 1 for steps, _ in seen) and any(drafts for _, drafts in seen)
    assert not any(steps > 1 and drafts for steps, drafts in seen)
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_blocks


def test_speculation_switches_off_above_the_batch_bound(tiny):
    engine = make_llm(tiny, draft(3, tiny, disable_by_batch_size=2)).llm_engine
    for i, p in enumerate(PROMPTS[:3]):
        engine.add_request(str(i), p, greedy(6 + 12 * i))
    seen = []
    while engine.has_unfinished_requests():
        sch = engine.scheduler
        unfinished = len(sch.running) + len(sch.waiting) + len(sch.swapped)
        engine.step()
        plan = engine.last_scheduler_output
        seen.append((unfinished, bool(plan.draft_token_ids)))
    assert not any(drafts for unfinished, drafts in seen if unfinished > 2)
    assert any(drafts for unfinished, drafts in seen if unfinished <= 2)


def test_async_scheduling_keeps_the_overlap_without_a_match(tiny, monkeypatch):
    """With async scheduling, an n-gram that never matches leaves steps in flight (the
    overlap stays); draft-model speculation reads every step back before the next plan."""
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "1")
    prompt = list(range(100, 140))  # no repeated n-gram, and the model does not repeat it
    for spec, overlap in ((ngram(3, lo=4, hi=4), True), (draft(3, tiny), False)):
        engine = make_llm(tiny, spec).llm_engine
        engine.add_request("r", prompt, greedy(12))
        steps = in_flight = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
            in_flight += engine.in_flight is not None
        if overlap:  # every step but the last left in flight, as without speculation
            assert in_flight == steps - 1 and engine.stats()["spec_decode_num_drafts"] == 0
        else:  # only the prefill's step (no token known yet to follow with drafts)
            assert in_flight == 1 and engine.stats()["spec_decode_num_drafts"] > 0


def _next_token_probs(loaded, sequences: list[list[int]]) -> torch.Tensor:
    """The model's softmax after each sequence ([len, vocab] float64), by one prefill of all
    of them through the torch reference attention."""
    model, mc = loaded.model, loaded.model_config
    lens = [len(s) for s in sequences]
    blocks_per = [-(-n // BLOCK) for n in lens]
    cache = KVCache(KVCacheSpec.for_model(mc, BLOCK, torch.float32), sum(blocks_per), 0,
                    torch.device("cpu"), "torch")
    width = max(blocks_per)
    tables = torch.zeros(len(sequences), width, dtype=torch.int32)
    slots, first = [], 0
    for i, (n, b) in enumerate(zip(lens, blocks_per)):
        tables[i, :b] = torch.arange(first, first + b)
        slots += [first * BLOCK + p for p in range(n)]
        first += b
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    meta = AttentionMetadata(torch.tensor(slots), tables, torch.tensor(lens, dtype=torch.int32),
                             cu, max(lens), max(lens), "torch")
    ids = torch.tensor([t for s in sequences for t in s])
    pos = torch.tensor([p for n in lens for p in range(n)])
    with torch.inference_mode():
        hidden = model(ids, pos, cache.layers, meta)[cu[1:].long() - 1]
        return torch.softmax(model.compute_logits(hidden).double(), -1)


def test_engine_samples_follow_the_target_distribution(tiny):
    """Many seeded requests of one prompt at temperature 1, the target as its own (greedy)
    draft model, so each draft is the most likely token and is accepted with its probability:
    the second token (drawn by the verification step, accepted draft or drawn from the
    residual) follows the target's marginal sum_t1 p(t1) p(t2 | t1) (chi-square). Resampling
    from p instead of the residual fails this bound (statistic ~195 against ~84)."""
    prompt = [7, 1, 99, 5]
    num = 1500
    llm = make_llm(tiny, draft(2, tiny, disable_by_batch_size=4096), num_kv_blocks=2048,
                   max_num_seqs=512)
    params = [SamplingParams(temperature=1.0, seed=1000 + i, max_tokens=3, ignore_eos=True)
              for i in range(num)]
    outs = llm.generate([prompt] * num, params, use_tqdm=False)
    s = llm.stats()
    assert 0 < s["spec_decode_num_accepted_tokens"] < s["spec_decode_num_draft_tokens"]
    assert s["spec_decode_num_drafts"] == num  # every request verified drafts once
    second = np.bincount([o.outputs[0].token_ids[1] for o in outs], minlength=384)
    p1 = _next_token_probs(tiny, [prompt])[0]
    p2 = _next_token_probs(tiny, [prompt + [t] for t in range(384)])
    marginal = (p1[:, None] * p2).sum(0).numpy()
    stat, df = _chi2(second, marginal)
    assert stat < _chi2_bound(df), (stat, df)
    assert_no_block_held(llm)


def test_speculative_plans_and_results_cross_as_plain_data(tiny, scheduling):
    """Plans with drafts and results with several tokens per sequence pickle with no Request
    inside; a second model runner driven only by the unpickled plans verifies the drafts to the
    same tokens (through chunked prefill, forks, copy-on-write and preemption)."""
    import pickle

    from test_boundary import _dumps, _llm, _mirror_runner, _workload

    prompts, params = _workload()
    prompts = [p + p[-6:] * 3 for p in prompts]  # repeated n-grams for the lookup to find
    greedy_rows = [i for i, p in enumerate(params) if p.greedy]
    ample = LLM(tiny, num_kv_blocks=400, block_size=8).generate(prompts, params,
                                                                 use_tqdm=False)
    llm = _llm(tiny, "recompute", speculative_config=ngram(3, disable_by_batch_size=64))
    engine = llm.llm_engine
    runner, mirror = engine.model_runner, _mirror_runner(engine)
    # greedy sequences draft their reference continuation (certain to be accepted: a random
    # tiny model's n-gram drafts almost never are), the others their n-grams
    reference = {tuple(prompts[i]): ample[i].outputs[0].token_ids for i in greedy_rows}
    ngram_propose = engine.scheduler.proposer.propose

    def oracle_propose(req, max_num):
        tokens = reference.get(tuple(req.prompt_token_ids))
        if tokens is None:
            return ngram_propose(req, max_num)
        start = len(req.output_token_ids)
        return tokens[start: start + min(max_num, 3)]

    engine.scheduler.proposer.propose = oracle_propose
    execute, fetch = runner.execute, runner.fetch
    plans, results, launched = [], [], {}

    def spy_execute(plan, *args, **kwargs):
        received = pickle.loads(_dumps(plan))
        assert received == plan
        plans.append(received)
        step = execute(plan, *args, **kwargs)
        twin = mirror.execute(received)
        if step is not None:
            launched[id(step)] = twin
        return step

    def spy_fetch(step):
        result = fetch(step)
        received = pickle.loads(_dumps(result))
        assert received == result and mirror.fetch(launched.pop(id(step))) == received
        results.append(received)
        return result

    runner.execute, runner.fetch = spy_execute, spy_fetch
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert_no_block_held(llm)
    assert any(p.draft_token_ids for p in plans) and any(p.preempted_req_ids for p in plans)
    assert any(any(r.extra_token_ids.values()) for r in results), "no draft accepted"
    assert ([[c.token_ids for c in outs[i].outputs] for i in greedy_rows]
            == [[c.token_ids for c in ample[i].outputs] for i in greedy_rows])


def test_device_side_spec_modules_do_not_name_request():
    """The rejection sampler and the draft model run on the device side: plans and rows,
    never a Request (as test_boundary checks for the model runner)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "pagedrt" / "spec"
    for name in ("rejection_sampler.py", "draft_model.py"):
        tree = ast.parse((root / name).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.asname or a.name for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "Request" not in names, f"{name} names Request"


def test_trim_frees_the_blocks_of_rejected_drafts_only():
    """Block size 4: a sequence of 7 known tokens verifies 6 drafts (slots up to position 12,
    4 blocks); 1 draft accepted leaves 8 computed tokens (2 blocks): the 3rd and 4th blocks,
    holding no computed token, are freed; nothing hashed ever held a draft, and the block the
    accepted token filled is hashed after the rollback."""
    from pagedrt.core.request import Request
    from pagedrt.kv.kv_cache_manager import KVCacheManager

    kv = KVCacheManager(num_blocks=8, block_size=4)
    req = Request("r", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=20))
    assert kv.allocate_slots(req, 6) is not None
    req.num_computed_tokens = 6
    req.output_token_ids.append(9)  # the 7th token, known: the step computes it + 6 drafts
    assert [b.block_id for b in kv.allocate_slots(req, 7)] == [2, 3]
    req.num_computed_tokens = 13
    assert kv.take_block_changes() == {"r": (0, [0, 1, 2, 3])}
    hashed = [b.block_id for b in kv.pool.blocks if b.block_hash is not None]
    assert hashed == [0]  # only the block full of known tokens (1..4)
    req.output_token_ids += [7, 8]  # one draft accepted, then the target's token
    req.num_computed_tokens = 8  # 7 known + 1 accepted
    kv.trim(req)
    kv.cache_computed_blocks(req)
    assert kv.block_ids("r") == [0, 1]  # positions 0..7: two blocks
    assert kv.take_block_changes() == {"r": (2, [])}
    assert [b.block_id for b in kv.pool.blocks if b.block_hash is not None] == [0, 1]
    assert kv.pool.blocks[2].ref_cnt == kv.pool.blocks[3].ref_cnt == 0
    kv.check_integrity()
    kv.trim(req)  # nothing past the computed tokens: no change
    assert not kv.has_block_changes
    kv.free(req)
    assert kv.num_free_blocks == 8
    kv.check_integrity()


def test_metrics_export_the_speculative_counters(tiny):
    from pagedrt.entrypoints.metrics import ServerMetrics

    llm = make_llm(tiny, draft(2, tiny))
    run(llm, PROMPTS[:2], greedy(12))
    stats = llm.llm_engine.stats(detailed=False)  # the engine core's snapshot
    metrics = ServerMetrics()
    metrics.bind(lambda: stats)
    text = metrics.render().decode()
    for series, key in (("pagedrt_spec_decode_num_drafts_total", "spec_decode_num_drafts"),
                        ("pagedrt_spec_decode_num_draft_tokens_total",
                         "spec_decode_num_draft_tokens"),
                        ("pagedrt_spec_decode_num_accepted_tokens_total",
                         "spec_decode_num_accepted_tokens"),
                        ("pagedrt_spec_decode_acceptance_rate", "spec_decode_acceptance_rate"),
                        ("pagedrt_spec_decode_mean_accepted_length",
                         "spec_decode_mean_accepted_length")):
        line = next(x for x in text.splitlines() if x.startswith(series + " "))
        assert float(line.split()[1]) == pytest.approx(stats[key]) and stats[key] > 0
    llm.llm_engine.reset_stats()
    assert llm.stats()["spec_decode_num_draft_tokens"] == 0


@pytest.mark.timeout(300)
def test_ngram_speculation_over_two_tensor_parallel_ranks(tiny):
    """Plans with drafts go to both worker processes; they verify them alike and return the
    tokens of one rank (greedy and seeded). A draft model is refused under tensor
    parallelism (it is not sharded)."""
    prompts = [p + p[-6:] * 3 for p in PROMPTS]
    params = [greedy(20), SamplingParams(temperature=0.9, seed=4, max_tokens=20,
                                         ignore_eos=True), greedy(14), greedy(9)]
    spec = ngram(3)
    expected = run(make_llm(tiny, spec), prompts, params)
    llm = make_llm(tiny, spec, tensor_parallel_size=2)
    try:
        out = run(llm, prompts, params)
        assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids
                                                         for o in expected]
        assert llm.stats()["spec_decode_num_accepted_tokens"] > 0
        assert_no_block_held(llm)
    finally:
        llm.llm_engine.shutdown()
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        make_llm(tiny, {"method": "draft_model", "num_speculative_tokens": 2,
                        "model": "unused-path"}, tensor_parallel_size=2)


def test_speculation_with_a_sliding_window(scheduling):
    """A model whose every layer sees only the last 12 positions (blocks before the window go
    back to the pool): drafts verified through the windowed attention give the greedy tokens
    of plain decoding, with the target as its own draft (every draft accepted, so blocks fill
    several tokens a step) and with n-gram drafts, in an ample and in a tight cache."""
    from test_kv_window import WINDOWED

    model = build_tiny_llama(seed=1, config=WINDOWED)
    prompts = [list(range(20, 60)), [5, 9] * 10 + [11, 12, 13], [3] * 7]
    params = greedy(30)
    ref = [o.outputs[0].token_ids for o in run(make_llm(model), prompts, params)]
    for spec in (draft(4, model), ngram(3)):
        for blocks in (128, 10):
            llm = make_llm(model, spec, num_kv_blocks=blocks)
            out = run(llm, prompts, params)
            assert [o.outputs[0].token_ids for o in out] == ref, (spec["method"], blocks)
            assert llm.stats()["spec_decode_num_draft_tokens"] > 0
            assert_no_block_held(llm)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculation_warm_up_runs_verification_and_leaves_no_state(tiny, method, monkeypatch):
    """`ModelRunner.warm_up_speculation` (run at CUDA start-up; called by hand here): two
    verification steps through the rejection sampler with a greedy and two sampled rows, the
    second beside a prefill chunk (eager); afterwards no row, no penalty slot, no draft-model
    state, the default generator where it was, no block held, the speculative counters at
    zero, and the same tokens (greedy, unseeded and seeded sampling) as an engine that never
    ran it."""
    spec = ngram(3) if method == "ngram" else draft(3, tiny)
    calls = []
    verify = rs.RejectionSampler.__call__

    def recorded(self, logits, rows, drafts, num_drafts, generator=None):
        calls.append(([r.params.greedy for r in rows], list(num_drafts)))
        return verify(self, logits, rows, drafts, num_drafts, generator)

    monkeypatch.setattr(rs.RejectionSampler, "__call__", recorded)
    params = [greedy(20), SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=20, ignore_eos=True,
                             presence_penalty=0.5)]
    prompts = [p + p[-6:] * 2 for p in PROMPTS[:3]]
    expected = run(make_llm(tiny, spec), prompts, params)
    llm = make_llm(tiny, spec)
    runner = llm.llm_engine.model_runner
    assert runner.spec_warm_up_s == 0.0  # not at start-up on CPU
    state = runner.generator.get_state()
    plans = []
    execute = runner.execute

    def spy(plan, *args):
        plans.append(plan)
        return execute(plan, *args)

    monkeypatch.setattr(runner, "execute", spy)
    calls.clear()
    runner.warm_up_speculation()
    assert calls == [([True, False, False], [3, 3, 3])] * 2
    assert [len(p.req_ids) for p in plans] == [3, 4, 0]
    chunk = plans[1].req_ids.index("spec-warm-up-chunk")
    assert plans[1].num_new_tokens[chunk] == 2 and len(plans[2].finished_req_ids) == 4
    assert runner.spec_warm_up_s > 0
    assert not runner.batch.row_of and torch.equal(runner.generator.get_state(), state)
    sampling = runner.batch.sampling
    assert not sampling.penalized.any() and len(sampling._free_slots) == sampling._num_slots
    assert runner.draft_proposer is None or not runner.draft_proposer.num_computed
    assert runner._last_sampled is None and runner._last_step_id == -1
    stats = llm.stats()
    assert all(v == 0 for k, v in stats.items() if k.startswith("spec_decode")), stats
    assert_no_block_held(llm)
    out = run(llm, prompts, params)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in expected]
    assert llm.stats()["spec_decode_num_drafts"] > 0
    llm.llm_engine.add_request("x", PROMPTS[0], greedy(4))
    llm.llm_engine.step()
    with pytest.raises(ValueError, match="before any request"):
        runner.warm_up_speculation()


def test_server_warm_up_runs_with_speculation(tiny):
    """The engine core's warm-up (penalties, min-p, logprobs, seeds, n = 2, a prefix hit)
    through verification steps: penalties and logprobs see the drafts before each position."""
    from pagedrt.entrypoints.engine_core import warm_up

    llm = make_llm(tiny, draft(3, tiny), max_model_len=128)
    engine = llm.llm_engine
    accepted = []
    update = engine.scheduler.update

    def counted(*args, **kwargs):
        out = update(*args, **kwargs)
        accepted.append(engine.scheduler.num_spec_accepted_tokens)
        return out

    engine.scheduler.update = counted
    warm_up(engine)
    assert max(accepted) > 0
    assert_no_block_held(llm)
    assert engine.stats()["spec_decode_num_drafts"] == 0  # reset after the warm-up


def test_penalties_and_min_tokens_see_the_drafts_before_each_position(tiny):
    """Penalties count the drafts before a position as generated tokens, and min_tokens holds
    a stop token back by position: greedy tokens equal plain decoding's."""
    base = make_llm(tiny)
    ref = run(base, PROMPTS, greedy(24))
    stop = ref[0].outputs[0].token_ids[2]  # a token the first request would stop on early
    params = [greedy(24, stop_token_ids=[stop], min_tokens=10),
              greedy(24, repetition_penalty=1.5),
              greedy(24, frequency_penalty=0.7, presence_penalty=0.4),
              greedy(24, repetition_penalty=0.8)]
    expected = [o.outputs[0].token_ids for o in run(base, PROMPTS, params)]
    assert stop not in expected[0][:9]
    for spec in (draft(3, tiny), ngram(3)):
        llm = make_llm(tiny, spec)
        got = [o.outputs[0].token_ids for o in run(llm, PROMPTS, params)]
        assert got == expected, spec["method"]
        assert llm.stats()["spec_decode_num_draft_tokens"] > 0
        assert_no_block_held(llm)


def test_no_drafts_while_a_beam_search_runs(tiny, scheduling):
    """Beam searches and speculating requests in one engine: no plan gives drafts while a
    search is unfinished, sampled requests keep their greedy tokens, and the search gives the
    result of an engine without speculation."""
    from pagedrt.sampling_params import BeamSearchParams

    beam = BeamSearchParams(beam_width=3, max_tokens=12, ignore_eos=True).to_sampling_params()
    params = [greedy(30), beam, greedy(40), greedy(9)]
    base = make_llm(tiny)
    expected = run(base, PROMPTS, params)
    llm = make_llm(tiny, draft(3, tiny))
    engine = llm.llm_engine
    seen = []
    schedule = engine.scheduler.schedule

    def recorded():
        searching = any(r.beam is not None or r.params.beam_search is not None
                        for q in (engine.scheduler.running, engine.scheduler.waiting)
                        for r in q)
        plan = schedule()
        seen.append((searching, bool(plan.draft_token_ids)))
        return plan

    engine.scheduler.schedule = recorded
    out = run(llm, PROMPTS, params)
    assert [[c.token_ids for c in o.outputs] for o in out] == [
        [c.token_ids for c in o.outputs] for o in expected]
    assert not any(drafts for searching, drafts in seen if searching)
    assert any(drafts for _, drafts in seen)  # after the search ended
    assert_no_block_held(llm)


def test_speculation_with_an_fp8_kv_cache(tiny):
    """Drafts verified over an FP8 KV cache (its scales written with the drafts' K/V and
    left behind by a rollback) give the greedy tokens of the same FP8 engine without
    speculation."""
    params = greedy(24)
    ref = [o.outputs[0].token_ids
           for o in run(make_llm(tiny, kv_cache_dtype="fp8"), PROMPTS, params)]
    for spec in (draft(3, tiny), ngram(3)):
        llm = make_llm(tiny, spec, kv_cache_dtype="fp8")
        out = run(llm, PROMPTS, params)
        assert [o.outputs[0].token_ids for o in out] == ref, spec["method"]
        assert llm.stats()["spec_decode_num_accepted_tokens"] > 0
        assert_no_block_held(llm)


def test_latency_bench_splits_step_times_by_verification(tiny):
    """`bench latency --prompts text` times each step and files it under the steps that
    verified drafts or the others (the medians spec_step_ms_median / plain_step_ms_median):
    every step is counted once. The prompt holds every token id, so that a unigram lookup
    always proposes."""
    from pagedrt.bench.latency import time_one_request

    prompt = list(range(tiny.model_config.vocab_size))
    llm = make_llm(tiny, ngram(3, lo=1, hi=1, disable_by_batch_size=4096,
                               min_mean_accepted_length=0))
    row = time_one_request(llm, prompt, 12)
    assert row["spec_steps"] >= 1 and row["steps_after_first"] >= row["spec_steps"]
    assert row["spec_step_ms_median"] > 0
    assert row["plain_step_ms_median"] is None or row["plain_step_ms_median"] > 0
    assert 0 < row["output_tokens"] <= 12
    off = time_one_request(make_llm(tiny), prompt, 12)
    assert off["spec_step_ms_median"] is None and off["plain_step_ms_median"] > 0
    assert off["steps_after_first"] == off["output_tokens"] - 1


def test_a_draft_path_that_is_no_model_names_speculative_config(tiny, tmp_path):
    """A draft model path that is neither a .gguf file nor a model folder: a ValueError that
    says it is speculative_config's draft (not the target's --model) and what it must be."""
    missing = str(tmp_path / "draft.gguf")
    with pytest.raises(ValueError, match="draft model") as e:
        make_llm(tiny, {"method": "draft_model", "num_speculative_tokens": 2,
                        "model": missing})
    assert repr(missing) in str(e.value) and "speculative_config" in str(e.value)
    assert ".gguf file or a Hugging Face folder" in str(e.value)
    assert "--model" not in str(e.value)
