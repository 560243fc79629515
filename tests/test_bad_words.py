"""bad_words (vLLM's): validation; tokenization (vLLM's two forms of a word); the plain and the
batched sampler against each other and against the rule (a one-token word never appears, a
sequence's last token never follows the rest of it among the generated tokens; the prompt does
not count); a ban that waits on a token still being sampled (async scheduling); the engine end
to end with the tiny model and a word-level tokenizer (mixed batches, preemption, n > 1,
speculative decoding, refused requests). CPU, fast."""

from __future__ import annotations

import random
from typing import ClassVar

import numpy as np
import pytest
import test_sampler_batched as batched_tests
import torch
from test_sampler_batched import EOS, VOCAB, Harness, _logits_of
from tiny_model import tiny_word, tiny_word_tokenizer, with_tokenizer

from pagedrt import LLM, SamplingParams
from pagedrt.core.plan import NewRequestData, StepPlan
from pagedrt.engine.bad_words import (
    OutputHistory,
    resolve_bad_words,
    tokenize_bad_words,
)
from pagedrt.engine.input_batch import InputBatch
from pagedrt.engine.sampler import Sampler, SamplingRow
from pagedrt.engine.validation import EngineLimits, validate_prompt

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---------------------------------------------------------------- SamplingParams
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"bad_words": "Paris"},
     (r"^bad_words='Paris' must be a list of non-empty strings \(the words that may not be "
      r"generated\), or None$")),
    ({"bad_words": 3}, r"^bad_words=3 must be a list of non-empty strings"),
    ({"bad_words": {"a": 1}}, r"^bad_words=\{'a': 1\} must be a list of non-empty strings"),
    ({"bad_words": ["ok", ""]}, (r"^bad_words\[1\]='' must be a non-empty string \(bad_words "
                                 r"is a list of words that may not be generated\)$")),
    ({"bad_words": ["ok", 5]}, r"^bad_words\[1\]=5 must be a non-empty string"),
    ({"bad_words": [b"ok"]}, r"^bad_words\[0\]=b'ok' must be a non-empty string"),
    ({"bad_words_token_ids": [[1, 2], []]},
     r"^bad_words_token_ids\[1\]=\[\] must be a non-empty list of token ids \(ints >= 0"),
    ({"bad_words_token_ids": [[1, -2]]}, r"^bad_words_token_ids\[0\]=\[1, -2\] must be a"),
    ({"bad_words_token_ids": [[1, True]]}, r"^bad_words_token_ids\[0\]=\[1, True\] must be"),
    ({"bad_words_token_ids": [[1, 2.0]]}, r"^bad_words_token_ids\[0\]=\[1, 2\.0\] must be"),
    ({"bad_words_token_ids": [5]}, r"^bad_words_token_ids\[0\]=5 must be a non-empty list"),
    ({"bad_words_token_ids": ["ab"]}, r"^bad_words_token_ids\[0\]='ab' must be a non-empty"),
    ({"bad_words_token_ids": 5}, r"^bad_words_token_ids=5 must be a list of non-empty lists"),
])
def test_bad_values_are_a_value_error_naming_the_entry_and_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_values_are_normalized():
    p = SamplingParams(bad_words=("Paris", " the city"))
    assert p.bad_words == ["Paris", " the city"] and p.bad_words_token_ids is None
    assert not p.adjusts_logits  # (not tokenized yet: the engine does it)
    assert SamplingParams(bad_words=[]).bad_words is None  # an empty list is no ban
    p = SamplingParams(bad_words_token_ids=[(1, np.int64(2)), np.array([7])])
    assert p.bad_words_token_ids == [[1, 2], [7]] and p.adjusts_logits
    assert all(type(t) is int for seq in p.bad_words_token_ids for t in seq)
    assert SamplingParams(bad_words_token_ids=[]).bad_words_token_ids is None


# ---------------------------------------------------------------- tokenization
def test_a_word_bans_its_plain_and_its_spaced_tokens():
    """vLLM's rule with a vocabulary where a word after a space is another token: the word
    (leading spaces dropped first) and " " + the word; duplicates once."""
    tok = tiny_word_tokenizer()
    a, b = tiny_word(1), tiny_word(2)
    assert tok.encode(f"{a} {b}", add_special_tokens=False) == [1, 194]
    assert tokenize_bad_words([a], tok) == [[1], [193]]
    assert tokenize_bad_words(["  " + a], tok) == [[1], [193]]
    assert tokenize_bad_words([f"{a} {b}", a, " " + a], tok) == [[1, 194], [193, 194], [1],
                                                                  [193]]


class _PieceTokenizer:
    """encode() from a table, recording its keyword arguments."""

    TABLE: ClassVar[dict[str, list[int]]] = {
        "foo": [5], " foo": [6], "bar": [7, 8], " bar": [9], "baz": [10, 11], " baz": [10, 12],
        "ok": [3], " ok": []}

    def __init__(self) -> None:
        self.kwargs: list[dict] = []

    def encode(self, text: str, **kwargs) -> list[int]:
        self.kwargs.append(kwargs)
        return list(self.TABLE.get(text, []))


def test_the_spaced_form_is_kept_only_where_it_starts_otherwise_with_as_many_tokens():
    tok = _PieceTokenizer()
    assert tokenize_bad_words(["foo", "bar", "baz", "ok"], tok) == [[5], [6], [7, 8], [10, 11],
                                                                    [3]]
    assert tok.kwargs and all(k == {"add_special_tokens": False} for k in tok.kwargs)
    for words, i in ((["foo", "   "], 1), (["nothing"], 0)):
        with pytest.raises(ValueError, match=rf"^bad_words\[{i}\]='.*' gives no token with "
                                             r"the model's tokenizer; give words with"):
            tokenize_bad_words(words, tok)


def test_resolve_tokenizes_into_a_copy_once():
    tok = tiny_word_tokenizer()
    p = SamplingParams(bad_words=[tiny_word(1)], max_tokens=5)
    r = resolve_bad_words(p, tok)
    assert r is not p and p.bad_words_token_ids is None  # (the caller's params untouched)
    assert r.bad_words_token_ids == [[1], [193]] and r.max_tokens == 5 and r.adjusts_logits
    assert resolve_bad_words(r, tok) is r  # already tokenized (the engine core gets it so)
    plain = SamplingParams()
    assert resolve_bad_words(plain, None) is plain
    given = SamplingParams(bad_words_token_ids=[[4, 5]])
    assert resolve_bad_words(given, None) is given
    with pytest.raises(ValueError, match=r"^bad_words=\['bb'\] needs the model's tokenizer, "
                                         r"and this model has none; give the token ids"):
        resolve_bad_words(p, None)


def test_validation_against_the_model():
    limits = EngineLimits(vocab_size=100, max_model_len=64, num_blocks=10, block_size=16,
                          max_num_seqs=8, eos_token_ids=(2,))
    with pytest.raises(ValueError, match=r"^bad_words=\['bb'\] are not tokenized yet: pass the "
                                         r"params through .*resolve_bad_words"):
        validate_prompt([1, 2], SamplingParams(bad_words=["bb"]), limits)
    validate_prompt([1, 2], SamplingParams(bad_words_token_ids=[[99], [5, 99]]), limits)
    with pytest.raises(ValueError, match=r"^bad_words_token_ids=\[\[5\], \[5, 100\]\]: token id "
                                         r"100 \(of the sequence \[5, 100\]\) is not in the "
                                         r"vocabulary \[0, 100\); leave it out$"):
        validate_prompt([1, 2], SamplingParams(bad_words_token_ids=[[5], [5, 100]]), limits)
    with pytest.raises(ValueError, match=r"^bad_words=\['xx'\]: token id 150"):
        validate_prompt([1, 2], SamplingParams(bad_words=["xx"], bad_words_token_ids=[[150]]),
                        limits)
    # allowed ids that single-token bad words all ban: nothing could be sampled
    with pytest.raises(ValueError, match=r"^allowed_token_ids=\[4, 5\] holds only token ids "
                                         r"that bad_words bans"):
        validate_prompt([1, 2], SamplingParams(allowed_token_ids=[4, 5],
                                               bad_words_token_ids=[[4], [5], [6, 7]]), limits)
    with pytest.raises(ValueError, match=r"holds only stop or EOS token ids, which "
                                         r"min_tokens=2 blocks .* \(and ids that bad_words"):
        validate_prompt([1, 2], SamplingParams(allowed_token_ids=[2, 5], min_tokens=2,
                                               bad_words_token_ids=[[5]]), limits)
    validate_prompt([1, 2], SamplingParams(allowed_token_ids=[4, 5],  # 5 only after 6
                                           bad_words_token_ids=[[4], [6, 5]]), limits)


# ---------------------------------------------------------------- the plain sampler
V = 50


def _logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_the_plain_sampler_bans_single_tokens_and_the_ends_of_matched_sequences():
    """Greedy rows: the banned best token gives the second best; a sequence bans only where
    the generated tokens end with the rest of it (never from the prompt's tokens)."""
    logits = _logits(6)
    best = logits.argmax(-1).tolist()
    second = logits.topk(2, dim=-1).indices[:, 1].tolist()
    cases = [  # (sequences, prompt, generated tokens, banned)
        ([[best[0]]], [1, 2], [], True),
        ([[7, best[1]]], [1, 2], [4, 7], True),
        ([[7, best[2]]], [1, 2], [7, 4], False),  # the prefix is not at the end
        ([[7, 8, best[3]]], [1, 2], [1, 7, 8], True),
        ([[7, 8, best[4]]], [1, 7], [8], False),  # its first token is the prompt's
        ([[9, best[5]]], [1, 9], [], False),  # only generated tokens count
    ]
    rows = [SamplingRow(SamplingParams(temperature=0, bad_words_token_ids=seqs), None, prompt,
                        out, EOS) for seqs, prompt, out, _ in cases]
    got = Sampler()(logits, rows).token_ids.tolist()
    assert got == [second[i] if c[3] else best[i] for i, c in enumerate(cases)]


# ---------------------------------------------------------------- the batched sampler
def _with_bad_words(original):
    """`_random_params` of tests/test_sampler_batched.py, plus bad-word sequences of one to
    three tokens on about 60% of the requests, drawn from a pool of six tokens which half of
    those requests are also restricted to (allowed_token_ids: the sequences then match
    often). At most three sequences, so at most three of the six are banned at a step; none
    of the pool is impossible or blocked by min_tokens."""
    def random_params(rng: random.Random, filters=True) -> SamplingParams:
        p = original(rng, filters)
        if rng.random() < 0.6:
            blocked = {*EOS, *p.stop_token_ids}
            pool = rng.sample([t for t in range(VOCAB) if t % 9 and t not in blocked], 6)
            p.bad_words_token_ids = [[rng.choice(pool) for _ in range(rng.choice([1, 2, 2, 3]))]
                                     for _ in range(rng.randrange(1, 4))]
            if rng.random() < 0.5:
                p.allowed_token_ids = pool
            p.__post_init__()
        return p
    return random_params


def _occurs(seq: list[int], tokens: list[int]) -> bool:
    m = len(seq)
    return any(tokens[i: i + m] == seq for i in range(len(tokens) - m + 1))


@pytest.mark.parametrize("seed, kernel, filters", [
    (20, False, True), (21, False, "top_k"), (22, False, False), (23, True, False),
    (24, True, True)])
def test_batched_equals_plain_and_the_bans_hold(seed, kernel, filters, monkeypatch):
    """The same tokens and logprobs from `sample_rows` (single tokens in the additive rows,
    sequences matched per step from the rows' tokens) as from the plain sampler, step after
    step in batches whose rows join, leave, fork and are preempted; no row's generated tokens
    hold a one-token word or a whole sequence, and the sequences' prefixes did come up."""
    if kernel:
        pytest.importorskip("triton")
    monkeypatch.setattr(batched_tests, "_random_params",
                        _with_bad_words(batched_tests._random_params))
    h = Harness(seed, kernel, filters)
    logits_of = _logits_of(seed)
    for _ in range(3):
        new = h.new_request()
        h.batch.apply(StepPlan(new_requests=[new], req_ids=[new.req_id]))
        h.active.append(new.req_id)
    state = h.batch.sampling
    bans_waited = 0  # rows whose tokens before the last ended with a sequence's prefix
    for _ in range(40):
        h.step(logits_of)
        with_sequences = 0
        for row, row_state in enumerate(h.batch.states):
            if row_state is None:
                assert state.bias.slot[row] == -1
                continue
            sequences = row_state.params.bad_words_token_ids or []
            output = row_state.output_token_ids
            assert not any(_occurs(seq, output) for seq in sequences), (sequences, output)
            long = [seq for seq in sequences if len(seq) > 1]
            with_sequences += bool(long)
            bans_waited += any(output[:-1][-len(seq) + 1:] == seq[:-1] for seq in long
                               if len(output) >= len(seq))
        assert state.bad_words.num_rows == with_sequences
    assert h.num_sampled > 100 and bans_waited > 0


def _row_with_output(batch: InputBatch, req_id: str, params: SamplingParams,
                     output: list[int]) -> int:
    """A row of a request with prompt [1, 2] that generated `output` (written as sampled)."""
    row = int(batch.apply(StepPlan(new_requests=[NewRequestData(req_id, [1, 2], [], params, 0,
                                                                EOS, [], 0)],
                                   req_ids=[req_id]))[0])
    rows = np.array([row])
    for step, token in enumerate(output):
        positions = batch.append_sampled(rows, 100 + step)
        batch.write_sampled([req_id], rows, batch.epoch[rows], positions, [token], 100 + step)
    return row


def test_a_ban_after_a_token_still_being_sampled_waits_for_it_on_the_device():
    """Async scheduling: a row's last token may still be being sampled by the step in flight
    (a placeholder on the host). A sequence [7, 8, t] after a known 7 then bans t only where
    the pending token, read on the device, is 8; without a known 7 nothing is banned; once
    the token is known the host alone decides, with the same tokens."""
    logits = _logits(4, seed=3)
    best = logits.argmax(-1).tolist()
    second = logits.topk(2, dim=-1).indices[:, 1].tolist()
    batch = InputBatch(max_model_len=16, device=torch.device("cpu"))
    known = [[4, 7], [4, 7], [4, 6], [7]]  # tokens before the pending one
    rows = np.array([_row_with_output(batch, f"r{i}", SamplingParams(
        temperature=0, bad_words_token_ids=[[7, 8, best[i]], [5]]), out)
        for i, out in enumerate(known)])
    positions = batch.append_sampled(rows, 200)  # in flight: its tokens are 8, 9, 8, 8
    pending = torch.tensor([8, 9, 8, 8])
    assert (batch.token_ids[rows, positions] == -1).all() and (batch.pending[rows] >= 0).all()
    history = OutputHistory(batch.token_ids, batch.pending, pending)
    sampler = Sampler()
    got = sampler.sample_rows(logits, batch.sampling, rows, batch.states, batch.num_tokens,
                              history=history).token_ids.tolist()
    expected = [second[0], best[1], best[2], second[3]]
    assert got == expected
    batch.write_sampled([f"r{i}" for i in range(4)], rows, batch.epoch[rows], positions,
                        pending.tolist(), 200)
    history = OutputHistory(batch.token_ids, batch.pending, None)
    assert sampler.sample_rows(logits, batch.sampling, rows, batch.states, batch.num_tokens,
                               history=history).token_ids.tolist() == expected
    with pytest.raises(ValueError, match="need the history of their generated tokens"):
        sampler.sample_rows(logits, batch.sampling, rows, batch.states, batch.num_tokens)


def test_rows_without_sequences_read_nothing_of_them():
    """A one-token word goes to the additive row only; a longer one to the sequences only;
    rows with neither touch neither. A greedy row with either is not "plain greedy"."""
    batch = InputBatch(max_model_len=16, device=torch.device("cpu"))
    single = _row_with_output(batch, "s", SamplingParams(temperature=0,
                                                         bad_words_token_ids=[[5]]), [])
    assert batch.sampling.bias.slot[single] >= 0 and batch.sampling.bad_words.num_rows == 0
    plain = [_row_with_output(batch, f"p{i}", SamplingParams(temperature=0.7, seed=i), [])
             for i in range(3)]
    Sampler().sample_rows(_logits(3), batch.sampling, np.array(plain), batch.states,
                          batch.num_tokens)  # (no history needed)
    seq = _row_with_output(batch, "q", SamplingParams(temperature=0,
                                                      bad_words_token_ids=[[5, 6]]), [])
    assert batch.sampling.bias.slot[seq] == -1 and batch.sampling.bad_words.num_rows == 1
    assert not batch.sampling.plain_greedy[[single, seq]].any()
    batch.apply(StepPlan(finished_req_ids=["q"]))
    assert batch.sampling.bad_words.num_rows == 0


# ---------------------------------------------------------------- the engine
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8] * 3, list(range(10, 47)), [5, 9] * 6 + [11, 12, 13], [3]]


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def _pair(tokens: list[int], start: int = 0) -> int:
    """The first i >= start where tokens[i + 1] is a word after a space (`tiny_word_tokenizer`'s
    upper half): the text of tokens[i: i + 2] is then two words, which tokenize back into
    them."""
    half = len(tiny_word_tokenizer()) // 2
    return next(i for i in range(start, len(tokens) - 1) if tokens[i + 1] >= half)


def test_a_one_token_bad_word_never_appears(tiny, scheduling):
    """The word of a token that greedy decoding makes (its third): the output is the same up
    to the word's first token, and neither of its tokens (plain, after a space) comes up."""
    llm = LLM(with_tokenizer(tiny), num_kv_blocks=64, block_size=8)
    tok = llm.get_tokenizer()
    for prompt in PROMPTS:
        base = _tokens(llm, [prompt], _greedy(16))[0]
        word = tok.decode([base[2]]).strip()
        banned = {seq[0] for seq in tokenize_bad_words([word], tok)}
        assert base[2] in banned and len(banned) == 2
        got = _tokens(llm, [prompt], _greedy(16, bad_words=[word]))[0]
        first = min(i for i, t in enumerate(base) if t in banned)
        assert got[:first] == base[:first] and len(got) == 16
        assert not banned & set(got), (word, got)


def test_a_two_token_bad_word_bans_its_second_token_after_its_first_only(tiny, scheduling):
    """A pair of words greedy decoding makes (the first pair whose second token is a word
    after a space, so the pair's text tokenizes back into it): the output is the same up to
    the pair's first token, which still appears, and its second token never follows either
    form of the first. A prompt ending with the first token does not ban the second: only
    generated tokens count."""
    llm = LLM(with_tokenizer(tiny), num_kv_blocks=64, block_size=8)
    tok = llm.get_tokenizer()
    for prompt in PROMPTS:
        base = _tokens(llm, [prompt], _greedy(24))[0]
        i = _pair(base)
        a, b = base[i], base[i + 1]
        phrase = tok.decode([a, b])
        sequences = tokenize_bad_words([phrase], tok)
        assert [a, b] in sequences and all(len(s) == 2 and s[1] == b for s in sequences)
        got = _tokens(llm, [prompt], _greedy(24, bad_words=[phrase]))[0]
        assert got[: i + 1] == base[: i + 1] and got[i + 1] != b  # a stays, b is banned
        assert not any(_occurs(seq, got) for seq in sequences), (phrase, got)
        after_prompt = _tokens(llm, [prompt + base[: i + 1]], _greedy(2, bad_words=[phrase]))[0]
        assert after_prompt[0] == b


def test_rows_without_bad_words_get_their_tokens_alone_in_a_mixed_batch(tiny, scheduling):
    """Requests without bad_words (greedy and seeded) give exactly the tokens they give alone
    while requests with them (a greedy one, and a sampled one with n = 2) share their steps;
    a small cache preempts some of them (their rows are rebuilt on return). The greedy one
    with bad words gives its own tokens alone too, and the bans hold in every sample."""
    tok = with_tokenizer(tiny).tokenizer
    plain = [_greedy(20), SamplingParams(temperature=0.9, seed=5, max_tokens=20, ignore_eos=True,
                                         top_k=20)]
    ref = LLM(with_tokenizer(tiny), num_kv_blocks=64, block_size=8)
    base = _tokens(ref, [PROMPTS[2]], _greedy(20))[0]
    i = _pair(base, 4)
    words = [tok.decode([base[1]]).strip(), tok.decode(base[i: i + 2])]  # one token, two
    banning = [_greedy(20, bad_words=words),
               SamplingParams(temperature=1.0, seed=3, max_tokens=20, ignore_eos=True, n=2,
                              bad_words=[tiny_word(i) for i in range(0, 192, 2)]
                              + [f"{tiny_word(i)} {tiny_word(i + 2)}" for i in range(1, 150, 4)])]
    alone = [_tokens(ref, [PROMPTS[i]], plain[i])[0] for i in (0, 1)]
    alone_banning = _tokens(ref, [PROMPTS[2]], banning[0])[0]
    assert alone_banning != base
    llm = LLM(with_tokenizer(tiny), num_kv_blocks=14, block_size=8)
    outs = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
                        [plain[0], banning[0], plain[1], banning[1]], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == alone[0]
    assert outs[2].outputs[0].token_ids == alone[1]
    assert outs[1].outputs[0].token_ids == alone_banning
    for out, params in ((outs[1], banning[0]), (outs[3], banning[1])):
        sequences = tokenize_bad_words(params.bad_words, tok)
        for sample in out.outputs:
            assert len(sample.token_ids) == 20
            assert not any(_occurs(seq, sample.token_ids) for seq in sequences)
    assert llm.llm_engine.stats()["num_preemptions"] > 0
    llm.llm_engine.check_integrity()
    assert llm.llm_engine.kv_manager.usage()["num_used_blocks"] == 0


def test_speculative_decoding_verifies_drafts_against_the_bans(tiny, scheduling):
    """Drafts from the unbanned model itself propose the banned tokens exactly where greedy
    decoding would make them; verification against the banned distribution rejects them:
    the greedy tokens equal those without speculation."""
    tok = with_tokenizer(tiny).tokenizer
    base = _tokens(LLM(with_tokenizer(tiny), num_kv_blocks=160, block_size=8), PROMPTS[:2],
                   _greedy(24))
    i, j = _pair(base[0], 3), _pair(base[1], 2)
    params = [_greedy(24, bad_words=[tok.decode(base[0][i: i + 2]), tok.decode([base[0][i + 6]])]),
              _greedy(24), _greedy(24, bad_words=[tok.decode(base[1][j: j + 2])])]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    expected = _tokens(LLM(with_tokenizer(tiny), num_kv_blocks=160, block_size=8), prompts,
                       params)
    assert expected[0] != base[0] and expected[2] != base[1]
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "model": tiny,
            "min_mean_accepted_length": 0, "disable_by_batch_size": 8}
    llm = LLM(with_tokenizer(tiny), num_kv_blocks=160, block_size=8, speculative_config=spec)
    assert _tokens(llm, prompts, params) == expected
    assert llm.stats()["spec_decode_num_draft_tokens"] > 0
    assert llm.llm_engine.kv_manager.usage()["num_used_blocks"] == 0


def test_refused_requests_hold_no_block_and_ids_work_without_a_tokenizer(tiny):
    llm = LLM(with_tokenizer(tiny), num_kv_blocks=64)
    good = _greedy(4)
    with pytest.raises(ValueError, match=r"^prompts\[1\]: bad_words\[1\]='  ' gives no token"):
        llm.generate(PROMPTS[:2], [good, SamplingParams(bad_words=["bb", "  "])],
                     use_tqdm=False)
    with pytest.raises(ValueError, match=r"^bad_words_token_ids=\[\[1, 400\]\]: token id 400"):
        llm.llm_engine.add_request("r", PROMPTS[0], SamplingParams(
            bad_words_token_ids=[[1, 400]]))
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.kv_manager.usage()["num_used_blocks"] == 0
    engine.check_integrity()
    # one tokenization per params object, whatever the number of prompts
    calls = []
    original = engine.resolve_bad_words
    engine.resolve_bad_words = lambda p: calls.append(p) or original(p)
    shared = _greedy(4, bad_words=["bb"])
    assert len(_tokens(llm, PROMPTS, shared)) == 4 and len(calls) == 1
    # a model without a tokenizer: words are refused, token ids work
    bare = LLM(tiny, num_kv_blocks=64)
    with pytest.raises(ValueError, match=r"^bad_words=\['bb'\] needs the model's tokenizer"):
        bare.generate(PROMPTS[:1], _greedy(4, bad_words=["bb"]), use_tqdm=False)
    first = _tokens(bare, PROMPTS[:1], _greedy(8))[0]
    got = _tokens(bare, PROMPTS[:1], _greedy(8, bad_words_token_ids=[[first[0]]]))[0]
    assert got[0] != first[0] and first[0] not in got
