"""logit_bias and allowed_token_ids: their validation, the plain and the batched sampler against
references computed from the logits, and the engine end to end (mixed batches, seeds,
preemption, speculative decoding, the engine-core loop, refused requests). CPU, fast."""

from __future__ import annotations

import math
import pickle
import random

import msgspec
import numpy as np
import pytest
import test_sampler_batched as batched_tests
import torch
from test_engine_core import running_core
from test_sampler_batched import EOS, VOCAB, Harness, _logits_of

from pagedrt import LLM, BeamSearchParams, SamplingParams
from pagedrt.core.plan import NewRequestData, StepPlan
from pagedrt.engine.input_batch import InputBatch
from pagedrt.engine.sampler import Sampler, SamplingRow
from pagedrt.engine.validation import EngineLimits, validate_prompt
from pagedrt.entrypoints.engine_core import Add, CoreOutputs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---------------------------------------------------------------- SamplingParams
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"logit_bias": {5: 100.5}}, r"^logit_bias\[5\]=100\.5 must be a number in \[-100, 100\]$"),
    ({"logit_bias": {5: -101}}, r"^logit_bias\[5\]=-101 must be a number in \[-100, 100\]$"),
    ({"logit_bias": {5: math.nan}}, r"^logit_bias\[5\]=nan must be a number in"),
    ({"logit_bias": {5: "1"}}, r"^logit_bias\[5\]='1' must be a number in"),
    ({"logit_bias": {5: True}}, r"^logit_bias\[5\]=True must be a number in"),
    ({"logit_bias": {"5": 1.0}},
     (r"^logit_bias\['5'\]: the key must be a token id \(an int >= 0, below the vocabulary's "
     r"size\)$")),
    ({"logit_bias": {-1: 1.0}}, r"^logit_bias\[-1\]: the key must be a token id"),
    ({"logit_bias": {10**500: 1.0}}, r"^logit_bias\[<an int of about 500 digits>\]: the key"),
    ({"logit_bias": [(5, 1.0)]},
     r"^logit_bias=\[\(5, 1\.0\)\] must be a map of token ids to biases in \[-100, 100\]$"),
    ({"allowed_token_ids": []}, r"^allowed_token_ids=\[\] must name at least one token id"),
    ({"allowed_token_ids": [1, -2]}, r"^allowed_token_ids\[1\]=-2 must be a token id \(an int"),
    ({"allowed_token_ids": [1, 2.0]}, r"^allowed_token_ids\[1\]=2\.0 must be a token id"),
    ({"allowed_token_ids": 7}, r"^allowed_token_ids=7 must be a non-empty list of token ids"),
])
def test_bad_values_are_a_value_error_naming_the_entry_and_the_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_values_are_normalized():
    p = SamplingParams(logit_bias={3: 5, 4: -100, 7: 100}, allowed_token_ids=(1, 2, 2))
    assert p.logit_bias == {3: 5.0, 4: -100.0, 7: 100.0}
    assert all(type(v) is float for v in p.logit_bias.values())
    assert p.allowed_token_ids == [1, 2, 2] and p.adjusts_logits
    assert SamplingParams(logit_bias={}).logit_bias is None  # an empty map is no bias
    assert not SamplingParams(logit_bias={}).adjusts_logits
    # numpy's ints and floats (a tokenizer's or an array's ids) as Python's
    p = SamplingParams(logit_bias={np.int64(5): np.float32(1.5)},
                       allowed_token_ids=np.array([1, 2], dtype=np.int32))
    assert p.logit_bias == {5: 1.5}
    assert all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())
    assert p.allowed_token_ids == [1, 2] and all(type(t) is int for t in p.allowed_token_ids)


@pytest.mark.parametrize("name, value", [("logit_bias", {3: 1.0}), ("allowed_token_ids", [3]),
                                         ("bad_words", ["x"]), ("bad_words_token_ids", [[3]])])
def test_beam_search_refuses_them(name, value):
    """The token controls (logit_bias, allowed_token_ids, bad words): a beam search scores
    the model's own log-probabilities."""
    beam = BeamSearchParams(beam_width=2, max_tokens=4).to_sampling_params()
    beam.__dict__[name] = value
    with pytest.raises(ValueError, match=rf"^{name}=.* cannot go with beam search"):
        beam.__post_init__()


def test_token_ids_outside_the_vocabulary_are_refused_against_the_model():
    limits = EngineLimits(vocab_size=100, max_model_len=64, num_blocks=10, block_size=16,
                          max_num_seqs=8)
    validate_prompt([1, 2], SamplingParams(logit_bias={99: 1.0}, allowed_token_ids=[0, 99]),
                    limits)
    with pytest.raises(ValueError, match=r"^logit_bias\[100\]: token id 100 is not in the "
                                         r"vocabulary \[0, 100\)$"):
        validate_prompt([1, 2], SamplingParams(logit_bias={3: 1.0, 100: 1.0}), limits)
    with pytest.raises(ValueError, match=r"^allowed_token_ids\[2\]=150 is not a token id of the "
                                         r"vocabulary \[0, 100\)$"):
        validate_prompt([1, 2], SamplingParams(allowed_token_ids=[0, 5, 150]), limits)


def test_allowed_ids_that_min_tokens_blocks_are_refused():
    """Only stop or EOS ids allowed while min_tokens blocks them: every logit would be -inf
    (the row then drew token 0, which is not allowed)."""
    limits = EngineLimits(vocab_size=100, max_model_len=64, num_blocks=10, block_size=16,
                          max_num_seqs=8, eos_token_ids=(2,))
    for params in (SamplingParams(allowed_token_ids=[2], min_tokens=3),
                   SamplingParams(allowed_token_ids=[2, 7], stop_token_ids=[7], min_tokens=1)):
        with pytest.raises(ValueError, match=r"^allowed_token_ids=\[2.*\] holds only stop or "
                                             r"EOS token ids, which min_tokens=\d blocks"):
            validate_prompt([1, 2], params, limits)
    for params in (SamplingParams(allowed_token_ids=[2, 8], min_tokens=3),  # 8 can be drawn
                   SamplingParams(allowed_token_ids=[2], min_tokens=3, ignore_eos=True),
                   SamplingParams(allowed_token_ids=[2])):
        validate_prompt([1, 2], params, limits)


# ---------------------------------------------------------------- the plain sampler
V = 50


def _logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _rows(params: list[SamplingParams]) -> list[SamplingRow]:
    return [SamplingRow(p, p.seed, [1, 2, 3], [], EOS) for p in params]


def test_the_sampler_bans_to_the_next_best_token_and_forces_with_plus_100():
    logits = _logits(8)
    best = logits.argmax(-1)
    second = logits.topk(2, dim=-1).indices[:, 1]
    worst = logits.argmin(-1)
    banned = [SamplingParams(temperature=0, logit_bias={int(t): -100}) for t in best]
    assert torch.equal(Sampler()(logits, _rows(banned)).token_ids, second)
    forced = [SamplingParams(temperature=t, seed=i, logit_bias={int(w): 100})
              for i, (t, w) in enumerate(zip([0, 1.0] * 4, worst))]
    assert torch.equal(Sampler()(logits, _rows(forced)).token_ids, worst)


def test_a_seeded_biased_row_draws_what_the_reference_draws_from_biased_logits():
    """The bias is a change of the logits and nothing else: sampling logits + bias without the
    setting gives the same tokens with the same seeds (the draws depend on seed and position),
    with and without filters."""
    logits = _logits(6, seed=1)
    rng = random.Random(0)
    for kwargs in ({}, {"top_k": 5, "top_p": 0.9}, {"min_p": 0.1}):
        biases = [{rng.randrange(V): rng.uniform(-5, 5) for _ in range(6)} for _ in range(6)]
        allowed = [None, None, rng.sample(range(V), 10), None, rng.sample(range(V), 3), None]
        params = [SamplingParams(temperature=0.9, seed=10 + i, logit_bias=b,
                                 allowed_token_ids=a, **kwargs)
                  for i, (b, a) in enumerate(zip(biases, allowed))]
        expected_logits = logits.clone()
        for i, (b, a) in enumerate(zip(biases, allowed)):
            for t, v in b.items():
                expected_logits[i, t] += v
            if a is not None:
                keep = torch.zeros(V, dtype=torch.bool)
                keep[a] = True
                expected_logits[i, ~keep] = float("-inf")
        plain = [SamplingParams(temperature=0.9, seed=10 + i, **kwargs) for i in range(6)]
        got = Sampler()(logits, _rows(params)).token_ids
        assert torch.equal(got, Sampler()(expected_logits, _rows(plain)).token_ids), kwargs
        assert got[2].item() in allowed[2] and got[4].item() in allowed[4]


def test_allowed_token_ids_restrict_every_draw_and_logprobs_stay_raw():
    logits = _logits(1, seed=2).expand(400, -1).contiguous()
    allowed = [7, 11, 30]
    rows = _rows([SamplingParams(temperature=2.0, allowed_token_ids=allowed, logprobs=1)] * 400)
    out = Sampler()(logits, rows, torch.Generator().manual_seed(0))
    assert set(out.token_ids.tolist()) == set(allowed)  # each drawn, nothing else
    raw = torch.log_softmax(logits[0], -1)
    for t, lp in zip(out.token_ids.tolist(), out.logprobs):
        assert lp.token_id == t and lp.logprob == pytest.approx(raw[t].item(), abs=1e-6)
        assert lp.top_logprobs[0][0] == raw.argmax().item()  # the model's, not the mask's


# ---------------------------------------------------------------- the batched sampler
def _with_controls(original):
    """`_random_params` of tests/test_sampler_batched.py, plus logit_bias and
    allowed_token_ids on about 60% of the requests (allowed ids never all impossible: that
    module's logits are -inf at multiples of 9, and min_tokens may block EOS and stop ids)."""
    def random_params(rng: random.Random, filters=True) -> SamplingParams:
        p = original(rng, filters)
        roll = rng.random()
        if roll < 0.6:
            p.logit_bias = {t: rng.choice([-100, -3.5, 0.0, 2.25, 100])
                            for t in rng.sample(range(VOCAB), rng.randrange(1, 5))}
        if 0.4 < roll < 0.8:
            blocked = {*EOS, *p.stop_token_ids}
            possible = [t for t in range(VOCAB) if t % 9 and t not in blocked]
            p.allowed_token_ids = rng.sample(possible, rng.randrange(1, 12))
        p.__post_init__()
        return p
    return random_params


@pytest.mark.parametrize("seed, kernel, filters", [
    (10, False, True), (11, False, True), (12, False, "top_k"), (13, True, False),
    (14, True, True)])
def test_batched_equals_plain_with_bias_and_allowed_ids(seed, kernel, filters, monkeypatch):
    """The same tokens and logprobs from `sample_rows` (additive rows kept per batch row) as
    from the plain sampler (built each call), step after step in batches whose rows join,
    leave, fork and are preempted, with every other setting mixed in; each allowed row's
    tokens are among its allowed ids."""
    if kernel:
        pytest.importorskip("triton")
    monkeypatch.setattr(batched_tests, "_random_params",
                        _with_controls(batched_tests._random_params))
    h = Harness(seed, kernel, filters)
    h.run(_logits_of(seed))
    bias = h.batch.sampling.bias
    num_allowed = 0
    for row, state in enumerate(h.batch.states):
        if state is None:
            assert bias.slot[row] == -1
            continue
        assert (bias.slot[row] >= 0) == state.params.adjusts_logits
        if state.params.allowed_token_ids is not None:
            num_allowed += 1
            assert set(state.output_token_ids) <= set(state.params.allowed_token_ids)
    assert bias.num_rows == int((bias.slot >= 0).sum())
    assert num_allowed


def test_rows_without_either_setting_never_touch_the_bias_table():
    batch = InputBatch(max_model_len=16, device=torch.device("cpu"))
    new = [NewRequestData(f"s{i}", [1, 2], [], SamplingParams(temperature=0.7, seed=i), 0, EOS,
                          [], 0) for i in range(4)]
    rows = batch.apply(StepPlan(new_requests=new, req_ids=[n.req_id for n in new]))
    Sampler().sample_rows(_logits(4), batch.sampling, rows, batch.states, batch.num_tokens)
    assert batch.sampling.bias.table is None and batch.sampling.bias.num_rows == 0
    assert not batch.sampling.plain_greedy[rows].any()
    greedy = NewRequestData("g", [1], [], SamplingParams(temperature=0, logit_bias={1: 1.0}), 0,
                            EOS, [], 0)
    row = batch.apply(StepPlan(new_requests=[greedy], req_ids=["g"]))
    assert not batch.sampling.plain_greedy[row].any()  # the argmax shortcut is not taken


# ---------------------------------------------------------------- the engine
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8] * 3, list(range(10, 47)), [5, 9] * 6 + [11, 12, 13], [3]]


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _top_tokens(llm: LLM, prompt: list[int]) -> list[tuple[int, float]]:
    """The model's 20 most likely tokens after `prompt`, most likely first, from the engine's
    raw logprobs (log_softmax keeps the order of the logits)."""
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=20),
                       use_tqdm=False)[0].outputs[0]
    return out.logprobs[0].top_logprobs


def test_a_ban_gives_the_next_best_token_and_a_plus_100_forces_one(tiny, scheduling):
    """-100 on the token greedy decoding picks first gives the model's second most likely
    token there (read from its logprobs, not hard-coded), and the request runs on from it as
    an unbiased request given that token does; +100 on the 20th most likely token makes it
    every token."""
    llm = LLM(tiny, num_kv_blocks=64, block_size=8)
    for prompt in PROMPTS:
        top = _top_tokens(llm, prompt)
        (best, best_lp), (second, _), (twentieth, twentieth_lp) = top[0], top[1], top[-1]
        assert best_lp - twentieth_lp < 100  # so a bias of 100 reorders any of them
        banned = _tokens(llm, [prompt], SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True, logit_bias={best: -100}))[0]
        assert banned[0] == second != best
        continued = _tokens(llm, [prompt + [second]], SamplingParams(
            temperature=0, max_tokens=7, ignore_eos=True))[0]
        if best not in continued:  # (else the ban changes a later token too)
            assert banned[1:] == continued
        forced = _tokens(llm, [prompt], SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True, logit_bias={twentieth: 100}))[0]
        assert forced == [twentieth] * 8
    assert llm.llm_engine.kv_manager.usage()["num_used_blocks"] == 0


def test_rows_without_settings_get_their_tokens_alone_in_a_mixed_batch(tiny, scheduling):
    """Requests without logit_bias or allowed_token_ids (greedy and seeded) give exactly the
    tokens they give alone while biased and restricted requests, n > 1 among them, share
    their steps; a small cache preempts some of them (their rows are rebuilt on return)."""
    plain = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
             SamplingParams(temperature=0.9, seed=5, max_tokens=20, ignore_eos=True, top_k=20)]
    controlled = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                       logit_bias={t: -100 for t in range(0, 384, 3)}),
        SamplingParams(temperature=1.0, seed=3, max_tokens=20, ignore_eos=True, n=2,
                       allowed_token_ids=[40, 41, 42, 43], logit_bias={40: 2.0}),
    ]
    alone = [_tokens(LLM(tiny, num_kv_blocks=64, block_size=8), [PROMPTS[i]], plain[i])[0]
             for i in (0, 1)]
    llm = LLM(tiny, num_kv_blocks=14, block_size=8)
    outs = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
                        [plain[0], controlled[0], plain[1], controlled[1]], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == alone[0]
    assert outs[2].outputs[0].token_ids == alone[1]
    assert all(t % 3 for t in outs[1].outputs[0].token_ids)
    for c in outs[3].outputs:
        assert len(c.token_ids) == 20 and set(c.token_ids) <= {40, 41, 42, 43}
    assert llm.llm_engine.stats()["num_preemptions"] > 0
    llm.llm_engine.check_integrity()
    assert llm.llm_engine.kv_manager.usage()["num_used_blocks"] == 0


def test_speculative_decoding_keeps_the_biased_tokens(tiny, scheduling):
    """Drafts (from the unbiased model itself) are verified against the biased target: greedy
    tokens equal those without speculation, and allowed ids hold for sampled rows."""
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                             logit_bias={t: -100 for t in range(100, 200)}),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=2, max_tokens=24, ignore_eos=True,
                             allowed_token_ids=list(range(50, 60)))]
    prompts = PROMPTS[:3]
    base = _tokens(LLM(tiny, num_kv_blocks=160, block_size=8), prompts, params)
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "model": tiny,
            "min_mean_accepted_length": 0, "disable_by_batch_size": 8}
    llm = LLM(tiny, num_kv_blocks=160, block_size=8, speculative_config=spec)
    got = _tokens(llm, prompts, params)
    assert got[:2] == base[:2]
    assert all(not 100 <= t < 200 for t in got[0])
    assert set(got[2]) <= set(range(50, 60))
    assert llm.stats()["spec_decode_num_draft_tokens"] > 0
    assert llm.llm_engine.kv_manager.usage()["num_used_blocks"] == 0


def test_a_refused_request_holds_no_block_and_queues_nothing(tiny):
    llm = LLM(tiny, num_kv_blocks=64)
    good = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match=r"allowed_token_ids\[1\]=384 is not a token id"):
        llm.generate(PROMPTS[:2], [good, SamplingParams(allowed_token_ids=[1, 384])],
                     use_tqdm=False)
    with pytest.raises(ValueError, match=r"logit_bias\[1000\]"):
        llm.llm_engine.add_request("r", PROMPTS[0], SamplingParams(logit_bias={1000: 1.0}))
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.kv_manager.usage()["num_used_blocks"] == 0
    engine.check_integrity()
    assert len(_tokens(llm, PROMPTS[:1], good)[0]) == 4  # still serving


def test_the_engine_core_receives_them_by_pickle(tiny, tmp_path):
    """Through the engine-core loop (pickled Add over zmq, token events back): the tokens of
    `LLM.generate` with the same settings."""
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                             logit_bias={t: -100 for t in range(0, 384, 2)}),
              SamplingParams(temperature=1.0, seed=9, max_tokens=10, ignore_eos=True,
                             allowed_token_ids=[5, 6, 7])]
    expected = _tokens(LLM(tiny, num_kv_blocks=64), PROMPTS[:2], params)
    engine = LLM(tiny, num_kv_blocks=64).llm_engine
    with running_core(engine, tmp_path) as (_thread, push, pull, _ours):
        for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
            push.send(pickle.dumps(Add(0, f"r{i}", prompt, p)))
        got: dict[str, list[int]] = {"r0": [], "r1": []}
        done = set()
        decoder = msgspec.msgpack.Decoder(CoreOutputs)
        while len(done) < 2:
            assert pull.poll(30_000), got
            out = decoder.decode(pull.recv())
            assert not out.failures, out.failures
            for e in out.events:
                got[e.request_id].append(e.token_id)
                if e.finish_reason is not None:
                    done.add(e.request_id)
    assert [got["r0"], got["r1"]] == expected
    assert np.all(np.asarray(got["r0"]) % 2 == 1)
