"""SamplingParams.output_kind (RequestOutputKind): what LLMEngine.step() reports for a request.

CUMULATIVE (the default) reports each sample's whole output so far, with what the output adds
in delta_text and delta_token_ids; DELTA reports only what each output adds (no copy of the
history: O(new tokens) per output instead of O(tokens so far)); FINAL_ONLY reports the request
once, finished. The tiny random-weight Llama (tests/tiny_model.py) runs with SmolLM2's
tokenizer, so that the outputs have text: its random tokens include bytes that split UTF-8
characters, which the detokenizer holds back, and a stop string ends the samples of an n = 2
request at different steps.
"""

from __future__ import annotations

import dataclasses

import pytest

import pagedrt
from pagedrt import LLM, BeamSearchParams, RequestOutputKind, SamplingParams
from pagedrt.engine.request import PLACEHOLDER_TOKEN_ID
from pagedrt.models.loader import LoadedModel

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = [5, 60, 200, 17, 300, 42]  # token ids below the tiny model's vocab (384)

# greedy, one sample to max_tokens; two seeded samples that a stop string ends at different
# steps (after 5 and 16 tokens: checked by test_the_two_samples_finish_at_different_steps)
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
SEEDED_N2 = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=16, logprobs=2, stop=["in"])
CASES = {"greedy-n1": GREEDY, "seeded-n2": SEEDED_N2}


@pytest.fixture(scope="module")
def model(tiny_model, smollm2) -> LoadedModel:
    """The tiny model with SmolLM2's tokenizer (ids below 384 decode to special tokens, bytes
    and short merges)."""
    return LoadedModel(tiny_model.model, tiny_model.model_config, smollm2.tokenizer, "tiny")


def make_engine(model: LoadedModel):
    """A fresh engine (async scheduling from the `scheduling` fixture's environment): each run
    starts with an empty prefix cache, so that runs compute the same shapes."""
    return LLM(model, num_kv_blocks=64, block_size=8).llm_engine


def with_kind(params: SamplingParams, kind) -> SamplingParams:
    return dataclasses.replace(params, output_kind=kind)


def run(engine, requests: dict[str, tuple[SamplingParams, bool]]) -> dict[str, list]:
    """Add the requests (id -> (params, stream)) and step to the end; request id -> its outputs
    in order, each as (step number, its CompletionOutputs, its `finished`). Also checks, for every sample of every request, that the tokens its outputs of
    one step hold (DELTA) or add (otherwise) are exactly those that became known on the host in
    that step: `len(output_token_ids) - num_pending_tokens` of its sequence, read from the
    engine's Request objects; and that no placeholder reaches an output."""
    heads = {rid: engine.add_request(rid, PROMPT, params, stream=stream)
             for rid, (params, stream) in requests.items()}
    known = {rid: {} for rid in requests}  # rid -> sample index -> tokens known so far
    seen: dict[str, list] = {rid: [] for rid in requests}
    step = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        step += 1
        reported: dict[tuple[str, int], int] = {}
        for out in outputs:
            delta_kind = (requests[out.request_id][0].output_kind is RequestOutputKind.DELTA
                          and heads[out.request_id].stream)
            for c in out.outputs:
                assert PLACEHOLDER_TOKEN_ID not in c.token_ids, (out.request_id, c.token_ids)
                added = c.token_ids if delta_kind else c.delta_token_ids
                reported[out.request_id, c.index] = (
                    reported.get((out.request_id, c.index), 0) + len(added))
            seen[out.request_id].append((step, out.outputs, out.finished))
        for rid, head in heads.items():
            if head.beam is not None:  # reported once: its hypotheses, not its slots' tokens
                continue
            for seq in head.group:
                now = len(seq.output_token_ids) - seq.num_pending_tokens
                before = known[rid].get(seq.sample_index, 0)
                if head.stream or all(s.is_finished for s in head.group):
                    assert reported.get((rid, seq.sample_index), 0) == now - before, (
                        rid, seq.sample_index, step)
                    known[rid][seq.sample_index] = now
    assert not engine.requests and engine.kv_manager.num_free_blocks == (
        engine.kv_manager.num_blocks)
    return seen


def samples(outputs: list) -> dict[int, list]:
    """index -> that sample's CompletionOutputs, in order."""
    by_index: dict[int, list] = {}
    for _step, outs, _finished in outputs:
        for c in outs:
            by_index.setdefault(c.index, []).append(c)
    return by_index


def final(outputs: list) -> dict[int, object]:
    """index -> the sample's CompletionOutput in the request's last (finished) output."""
    _step, outs, finished = outputs[-1]
    assert finished
    return {c.index: c for c in outs}


def concat(lists) -> list:
    return [item for part in lists for item in part]


def fields(c) -> tuple:
    return (c.token_ids, c.text, c.logprobs, c.cumulative_logprob, c.finish_reason,
            c.stop_reason)


def test_the_two_samples_finish_at_different_steps(model, scheduling):
    """The premise of the n = 2 cases: sample 0 meets the stop string early, sample 1 runs
    on (so the request goes on reporting a finished sample), and text is held back at times."""
    seen = run(make_engine(model), {"r": (SEEDED_N2, True)})["r"]
    ends = final(seen)
    assert [len(ends[i].token_ids) for i in (0, 1)] == [5, 16]
    assert [ends[i].finish_reason for i in (0, 1)] == ["stop", "stop"]
    per_sample = samples(seen)
    assert any(len(c.delta_token_ids) == 1 and not c.delta_text for c in per_sample[1])


@pytest.mark.parametrize("case", CASES)
def test_cumulative_deltas_add_up_to_the_final_output(model, scheduling, case):
    """CUMULATIVE: every output holds the whole sample so far, and its delta_token_ids and
    delta_text are what it adds to the sample's previous output (delta_token_ids used to be
    always empty): their concatenation is the final output."""
    params = CASES[case]
    assert params.output_kind is RequestOutputKind.CUMULATIVE  # the default
    seen = run(make_engine(model), {"r": (params, True)})["r"]
    assert len(seen) > 3  # streamed: reported as it advances
    ends = final(seen)
    assert sorted(ends) == list(range(params.n))
    for index, outs in samples(seen).items():
        tokens: list[int] = []
        text = ""
        for c in outs:
            assert c.token_ids == tokens + c.delta_token_ids
            assert c.text == text + c.delta_text
            assert len(c.logprobs) == len(c.token_ids)
            tokens, text = c.token_ids, c.text
        assert concat(c.delta_token_ids for c in outs) == ends[index].token_ids
        assert "".join(c.delta_text for c in outs) == ends[index].text
        assert ends[index].text and len(ends[index].token_ids) >= 5


@pytest.mark.parametrize("case", CASES)
def test_delta_outputs_concatenate_to_the_cumulative_result(model, scheduling, case):
    """DELTA: each output holds only what it adds (token_ids == delta_token_ids, text ==
    delta_text, at most the one token a step samples, logprobs for those tokens alone), while
    cumulative_logprob stays the running sum; concatenated they are the CUMULATIVE run's final
    output, token for token, character for character and logprob for logprob."""
    params = CASES[case]
    reference = final(run(make_engine(model), {"r": (params, True)})["r"])
    delta = with_kind(params, RequestOutputKind.DELTA)
    seen = run(make_engine(model), {"r": (delta, True)})["r"]
    assert len(seen) > 3
    per_sample = samples(seen)
    assert sorted(per_sample) == sorted(reference) == list(range(params.n))
    for index, outs in per_sample.items():
        ref = reference[index]
        running = 0.0
        for c in outs:
            assert c.token_ids == c.delta_token_ids and c.text == c.delta_text
            assert len(c.token_ids) <= 1  # no speculation: one token per step at most
            assert len(c.logprobs) == len(c.token_ids)
            running += sum(lp.logprob for lp in c.logprobs)
            assert c.cumulative_logprob == pytest.approx(running, abs=1e-9)
        assert concat(c.token_ids for c in outs) == ref.token_ids
        assert "".join(c.text for c in outs) == ref.text
        assert concat(c.logprobs for c in outs) == ref.logprobs
        assert (outs[-1].cumulative_logprob, outs[-1].stop_reason) == (
            ref.cumulative_logprob, ref.stop_reason)
        # finished once, then reported (while a sibling runs on) with nothing new
        reasons = [c.finish_reason for c in outs]
        done = reasons.index(ref.finish_reason)
        assert reasons == [None] * done + [ref.finish_reason] * (len(outs) - done)
        assert all(not c.token_ids and not c.text and not c.logprobs for c in outs[done + 1:])
    if params.n == 2:
        assert len(per_sample[0]) == len(per_sample[1])  # the finished sample kept reporting
        assert per_sample[0][-1].finish_reason is not None and per_sample[0][-1].token_ids == []


@pytest.mark.parametrize("kind", [RequestOutputKind.FINAL_ONLY, "final_only"])
def test_final_only_reports_once_the_cumulative_result(model, scheduling, kind):
    """FINAL_ONLY: one output per request, finished, equal to the CUMULATIVE run's final one;
    and add_request(stream=False) still means that whatever the kind (DELTA included)."""
    reference = final(run(make_engine(model), {"r": (SEEDED_N2, True)})["r"])
    seen = {rid: run(make_engine(model), {rid: request})[rid] for rid, request in {
        "final": (with_kind(SEEDED_N2, kind), True),
        "delta-unstreamed": (with_kind(SEEDED_N2, RequestOutputKind.DELTA), False)}.items()}
    for rid, outputs in seen.items():
        assert len(outputs) == 1, rid
        ends = final(outputs)
        assert sorted(ends) == [0, 1]
        for index, c in ends.items():
            assert fields(c) == fields(reference[index]), (rid, index)
            assert c.delta_token_ids == c.token_ids and c.delta_text == c.text


def test_beam_search_is_reported_once_whatever_the_kind(model, scheduling):
    """A beam search's result (its hypotheses, best first) comes once, whole, as before."""
    params = BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True).to_sampling_params()
    reference = final(run(make_engine(model), {"b": (params, True)})["b"])
    seen = run(make_engine(model), {"b": (with_kind(params, "delta"), True)})["b"]
    assert len(seen) == 1
    ends = final(seen)
    assert all(len(c.token_ids) == 6 for c in ends.values())
    assert [ends[i].token_ids for i in (0, 1)] == [reference[i].token_ids for i in (0, 1)]


@pytest.mark.parametrize("value", ["cumulative", "DELTA", "Final_Only"])
def test_output_kind_names_become_the_enum(value):
    params = SamplingParams(output_kind=value)
    assert params.output_kind is RequestOutputKind[value.upper()]
    assert SamplingParams().output_kind is RequestOutputKind.CUMULATIVE
    assert pagedrt.RequestOutputKind is RequestOutputKind
    assert [k.value for k in RequestOutputKind] == [0, 1, 2]
    assert [k.name for k in RequestOutputKind] == ["CUMULATIVE", "DELTA", "FINAL_ONLY"]


@pytest.mark.parametrize(("value", "shown"), [
    (5, "5"), (1, "1"), ("partial", "'partial'"), (None, "None"), ("", "''"),
    ("delta ", "'delta '"), (RequestOutputKind, "<enum 'RequestOutputKind'>")])
def test_bad_output_kinds_are_a_value_error_naming_the_value(value, shown):
    with pytest.raises(ValueError, match=r"^output_kind=(.*) must be a RequestOutputKind or one "
                       r"of 'cumulative', 'delta', 'final_only'$") as e:
        SamplingParams(output_kind=value)
    assert str(e.value).startswith(f"output_kind={shown} ")


def test_llm_generate_returns_whole_outputs_for_delta_params(model, scheduling):
    """LLM.generate adds its requests unstreamed: DELTA params change nothing in its result."""
    params = [SEEDED_N2, GREEDY]
    reference = LLM(model, num_kv_blocks=64, block_size=8).generate(
        [PROMPT, PROMPT[:3]], params, use_tqdm=False)
    outs = LLM(model, num_kv_blocks=64, block_size=8).generate(
        [PROMPT, PROMPT[:3]], [with_kind(p, RequestOutputKind.DELTA) for p in params],
        use_tqdm=False)
    for out, ref in zip(outs, reference):
        assert out.finished and len(out.outputs) == len(ref.outputs)
        for c, r in zip(out.outputs, ref.outputs):
            assert fields(c) == fields(r)
            assert len(c.token_ids) == len(c.logprobs) >= 5 and c.text
    assert len(outs[1].outputs[0].token_ids) == GREEDY.max_tokens


def test_fields_assigned_after_construction_are_checked_when_added(model):
    """add_request checks the params again: an output_kind assigned by name after
    construction streams as that kind, and a bad value assigned later is a ValueError naming
    it, with nothing queued."""
    engine = make_engine(model)
    params = dataclasses.replace(GREEDY)
    params.output_kind = "delta"
    seen = run(engine, {"r": (params, True)})["r"]
    assert params.output_kind is RequestOutputKind.DELTA
    assert all(len(c.token_ids) <= 1 for _, outs, _ in seen for c in outs)
    for name, value in (("output_kind", "partial"), ("temperature", -1.0), ("top_p", 0.0)):
        bad = dataclasses.replace(GREEDY)
        setattr(bad, name, value)
        with pytest.raises(ValueError, match=f"^{name}="):
            engine.add_request(f"bad-{name}", PROMPT, bad)
        assert not engine.has_unfinished_requests() and f"bad-{name}" not in engine.requests
