"""SamplingParams.prompt_logprobs through the engine: RequestOutput.prompt_logprobs against a
reference computed apart, with one forward of the model over the whole prompt (the tiny
random-weight Llama over a plain cache with the torch attention; SmolLM2 against HF
transformers on the same weights), under chunked prefill, an available prefix-cache hit,
preemption by recompute, n > 1, speculative decoding, the output kinds, token-event mode and
aborts (docs/design.md, "Request lifecycle")."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import torch

from pagedrt import LLM, BeamSearchParams, RequestOutputKind, SamplingParams
from pagedrt.engine.sampler import TokenLogprobs
from pagedrt.entrypoints.engine_core import CoreOutputs
from pagedrt.ops.attention import AttentionMetadata
from pagedrt.outputs import PromptLogprobsEvent, TokenEvent

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = [(7 + 31 * i) % 384 for i in range(40)]  # below the tiny model's vocab (384)


def reference_logprobs(loaded, prompt: list[int]) -> torch.Tensor:
    """[len(prompt), vocab] float32 log_softmax of the model's logits at every position, from
    one forward over the whole prompt (a one-sequence cache of contiguous blocks, the torch
    attention): row p is the distribution of the token at p + 1."""
    cfg = loaded.model_config
    n, bs = len(prompt), 16
    num_blocks = -(-n // bs)
    shape = (num_blocks, bs, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_hidden_layers)]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),
        block_tables=torch.arange(num_blocks, dtype=torch.int32)[None],
        seq_lens=torch.tensor([n], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
        max_query_len=n, max_seq_len=n, backend="torch")
    with torch.inference_mode():
        hidden = loaded.model(torch.tensor(prompt), torch.arange(n), caches, meta)
        return torch.log_softmax(loaded.model.compute_logits(hidden).float(), dim=-1)


def assert_matches(entries: list, prompt: list[int], reference: torch.Tensor, k: int,
                   atol: float = 1e-4) -> None:
    """One entry per prompt token, None first, each the prompt token's logprob and rank and
    the k most likely tokens at its position, as the reference says."""
    assert entries is not None and len(entries) == len(prompt)
    assert entries[0] is None
    for j in range(1, len(prompt)):
        e, ref = entries[j], reference[j - 1]
        assert isinstance(e, TokenLogprobs)
        assert e.token_id == prompt[j]
        value = ref[prompt[j]].item()
        assert e.logprob == pytest.approx(value, abs=atol)
        # rank and the top tokens as the reference orders them, up to ties within atol
        assert 1 + int((ref > value + atol).sum()) <= e.rank <= 1 + int((ref > value - atol).sum())
        assert len(e.top_logprobs) == k
        assert [v for _, v in e.top_logprobs] == pytest.approx(ref.topk(k).values.tolist(),
                                                               abs=atol)
        for token, lp in e.top_logprobs:
            assert lp == pytest.approx(ref[token].item(), abs=atol)


def make_llm(tiny, **kw) -> LLM:
    return LLM(tiny, **{"num_kv_blocks": 64, "block_size": 8, **kw})


def greedy(max_tokens: int = 4, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def assert_free(llm: LLM) -> None:
    engine = llm.llm_engine
    engine.check_integrity()
    assert not engine.has_unfinished_requests()
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_blocks


@pytest.mark.parametrize("k", [0, 5])
def test_single_request_matches_one_forward(tiny, scheduling, k):
    llm = make_llm(tiny)
    out = llm.generate([PROMPT], greedy(prompt_logprobs=k), use_tqdm=False)[0]
    assert_matches(out.prompt_logprobs, PROMPT, reference_logprobs(tiny, PROMPT), k)
    # the last prompt position still samples the first token: as without prompt logprobs
    plain = make_llm(tiny).generate([PROMPT], greedy(), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    assert plain.prompt_logprobs is None
    assert_free(llm)


def test_batch_where_only_some_ask(tiny, scheduling):
    prompts = [PROMPT[:13], PROMPT[5:30], PROMPT[2:9]]
    params = [greedy(), greedy(prompt_logprobs=3), greedy(logprobs=2)]
    llm = make_llm(tiny)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert outs[0].prompt_logprobs is None and outs[2].prompt_logprobs is None
    assert_matches(outs[1].prompt_logprobs, prompts[1], reference_logprobs(tiny, prompts[1]), 3)
    alone = make_llm(tiny).generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in alone]
    assert_free(llm)


def test_prompt_over_several_chunked_prefill_steps(tiny, scheduling):
    llm = make_llm(tiny, max_num_batched_tokens=16)
    prompts = [PROMPT, PROMPT[3:28]]
    outs = llm.generate(prompts, [greedy(prompt_logprobs=2), greedy(prompt_logprobs=1)],
                        use_tqdm=False)
    assert llm.stats()["num_chunked_prefill_steps"] >= 2  # 40 + 25 tokens, 16 a step
    for out, prompt, k in zip(outs, prompts, (2, 1)):
        assert_matches(out.prompt_logprobs, prompt, reference_logprobs(tiny, prompt), k)
    assert_free(llm)


def test_prefix_cache_hit_is_not_taken(tiny, scheduling):
    llm = make_llm(tiny)
    llm.generate([PROMPT], greedy(), use_tqdm=False)  # its blocks stay cached
    again = llm.generate([PROMPT], greedy(), use_tqdm=False)[0]
    assert again.num_cached_tokens >= 32  # a hit is there to take
    out = llm.generate([PROMPT], greedy(prompt_logprobs=4), use_tqdm=False)[0]
    assert out.num_cached_tokens == 0
    assert_matches(out.prompt_logprobs, PROMPT, reference_logprobs(tiny, PROMPT), 4)
    assert out.outputs[0].token_ids == again.outputs[0].token_ids
    assert_free(llm)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_sends_no_entry_twice(tiny, scheduling, mode):
    # 4 x (24 + 40) tokens want 32 blocks of 8 and get 20: sequences are preempted and
    # recompute their prompts (or swap out and back), some in the middle of their chunked
    # prefill
    llm = make_llm(tiny, num_kv_blocks=20, max_num_batched_tokens=16, preemption_mode=mode)
    prompts = [PROMPT[i: i + 24] for i in range(4)]
    outs = llm.generate(prompts, greedy(max_tokens=40, prompt_logprobs=2), use_tqdm=False)
    assert llm.stats()[f"num_preemptions_{mode}"] > 0
    for out, prompt in zip(outs, prompts):
        assert_matches(out.prompt_logprobs, prompt, reference_logprobs(tiny, prompt), 2)
    alone = make_llm(tiny).generate(prompts, greedy(max_tokens=40), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in alone]
    assert_free(llm)


def test_preempted_in_the_middle_of_its_prompt(tiny, monkeypatch):
    """A sequence preempted (recompute) after two of its prompt's chunks computes them again,
    but their entries come once, and the rest follow in order."""
    monkeypatch.setenv("PAGEDRT_ASYNC_SCHEDULING", "0")
    llm = make_llm(tiny, max_num_batched_tokens=16, preemption_mode="recompute")
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, greedy(prompt_logprobs=1), stream=False)
    engine.step()
    engine.step()
    req = engine.requests["r"]
    assert req.num_computed_tokens == 32 and len(req.prompt_logprobs) == 33
    engine.scheduler.running.remove(req)  # as Scheduler._preempt does for the last one
    engine.scheduler.running.append(req)
    assert engine.scheduler._preempt(req) == 1 and req.num_computed_tokens == 0
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        engine.check_integrity()
    assert req.num_preemptions == 1
    (out,) = outputs
    assert_matches(out.prompt_logprobs, PROMPT, reference_logprobs(tiny, PROMPT), 1)


def test_one_token_prompt_and_n_samples(tiny, scheduling):
    llm = make_llm(tiny)
    one, two = llm.generate([[42], PROMPT[:10]], [
        greedy(prompt_logprobs=3),
        SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=4, prompt_logprobs=0)],
        use_tqdm=False)
    assert one.prompt_logprobs == [None]
    assert len(two.outputs) == 3
    assert_matches(two.prompt_logprobs, PROMPT[:10], reference_logprobs(tiny, PROMPT[:10]), 0)
    assert_free(llm)


def test_with_speculative_decoding(tiny, scheduling):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}
    llm = make_llm(tiny, speculative_config=spec, max_num_batched_tokens=16)
    prompts = [PROMPT[:6] * 4, PROMPT[10:31]]  # (a repeating prompt: drafts match)
    outs = llm.generate(prompts, [greedy(max_tokens=40), greedy(max_tokens=40,
                                                                 prompt_logprobs=2)],
                        use_tqdm=False)
    assert llm.stats()["spec_decode_num_drafts"] > 0
    alone = make_llm(tiny).generate(prompts, greedy(max_tokens=40), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in alone]
    assert outs[0].prompt_logprobs is None
    assert_matches(outs[1].prompt_logprobs, prompts[1], reference_logprobs(tiny, prompts[1]), 2)
    assert_free(llm)


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_output_kinds(tiny, scheduling, kind):
    """CUMULATIVE: every output has them; DELTA: only the first; FINAL_ONLY: its one output.
    Complete in each output that has them."""
    engine = make_llm(tiny).llm_engine
    engine.add_request("r", PROMPT[:12], greedy(max_tokens=5, prompt_logprobs=1,
                                                output_kind=kind))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    with_them = [o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None]
    if kind is RequestOutputKind.DELTA:
        assert len(outputs) > 1 and outputs[0].prompt_logprobs is not None
        assert len(with_them) == 1
    else:
        assert len(with_them) == len(outputs) >= 1
    reference = reference_logprobs(tiny, PROMPT[:12])
    for entries in with_them:
        assert_matches(entries, PROMPT[:12], reference, 1)


def test_token_event_mode_sends_each_entry_once(tiny, scheduling):
    """The engine core's mode: PromptLogprobsEvents carry the entries (None excluded) in
    order, before the request's first token, and they cross as typed msgpack."""
    llm = make_llm(tiny, num_kv_blocks=20, max_num_batched_tokens=16,
                   preemption_mode="recompute")
    engine = llm.llm_engine
    events: list = []
    prompt_events: list = []
    engine.token_events, engine.prompt_logprob_events = events, prompt_events
    prompts = {f"r{i}": PROMPT[i: i + 24] for i in range(4)}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, greedy(max_tokens=40, prompt_logprobs=2))
    got = {rid: [] for rid in prompts}
    first_token_seen = set()
    while engine.has_unfinished_requests():
        assert engine.step() == []
        message = msgspec.msgpack.Decoder(CoreOutputs).decode(msgspec.msgpack.encode(
            CoreOutputs(list(events), [], None, list(prompt_events))))
        for event in message.prompt_logprobs:
            assert isinstance(event, PromptLogprobsEvent)
            assert event.request_id not in first_token_seen
            got[event.request_id] += event.logprobs
        first_token_seen.update(e.request_id for e in message.events)
        assert all(isinstance(e, TokenEvent) for e in message.events)
        events.clear()
        prompt_events.clear()
    assert llm.stats()["num_preemptions_recompute"] > 0
    for rid, prompt in prompts.items():
        assert_matches([None, *got[rid]], prompt, reference_logprobs(tiny, prompt), 2)


def test_abort_in_the_middle_of_the_prompt_frees_everything(tiny, scheduling):
    llm = make_llm(tiny, max_num_batched_tokens=16)
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, greedy(prompt_logprobs=2))
    engine.step()
    assert engine.abort_request("r")
    while engine.has_unfinished_requests():
        assert engine.step() == []
    assert_free(llm)


@pytest.mark.parametrize("value", [-1, 21, 2.0, "3", True])
def test_bad_values_are_refused_naming_the_range(value):
    with pytest.raises(ValueError, match=r"prompt_logprobs=.* must be None or an int in "
                                         r"\[0, 20\]"):
        SamplingParams(prompt_logprobs=value)


def test_refused_with_beam_search(tiny):
    params = BeamSearchParams(beam_width=2, max_tokens=4).to_sampling_params()
    with pytest.raises(ValueError, match=r"prompt_logprobs=2 cannot go with beam search"):
        dataclasses.replace(params, prompt_logprobs=2)
    llm = make_llm(tiny)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        llm.generate([PROMPT], SamplingParams(prompt_logprobs=25), use_tqdm=False)
    assert_free(llm)


def test_smollm2_matches_hf(smollm2, hf_smollm2):
    tok = smollm2.tokenizer
    prompt = tok.encode("The quick brown fox jumps over the lazy dog, and then it ran away.")
    llm = LLM(smollm2, num_kv_blocks=64, max_num_batched_tokens=8)  # chunked
    out = llm.generate([prompt], greedy(max_tokens=2, prompt_logprobs=5), use_tqdm=False)[0]
    with torch.inference_mode():
        logits = hf_smollm2(input_ids=torch.tensor([prompt])).logits[0]
    assert_matches(out.prompt_logprobs, prompt, torch.log_softmax(logits.float(), dim=-1), 5,
                   atol=2e-3)
