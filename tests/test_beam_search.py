"""Beam search in the engine (docs/design.md, "Beam search"): sequences and scores against HF
transformers' `generate(num_beams=W)` on the same weights (the real SmolLM2 in fp32, and the
tiny random-weight Llama with EOS ids for every length-penalty and early-stopping variant),
width 1 against greedy, the memory bound per step, preemption, prefix caching, the slot
assignment on the device against the host's, and bad input."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from tiny_model import TINY_CONFIG, build_tiny_llama

from pagedrt import LLM, BeamSearchParams, SamplingParams
from pagedrt.bench.common import hf_model_like
from pagedrt.core.beam import assign_slots, beam_score, num_beam_candidates
from pagedrt.engine import beam_search as device_beams
from pagedrt.kv.kv_cache import kv_bytes_per_block

TINY_EOS = (19, 207)  # two EOS ids (K = 3 W): tokens the tiny model picks now and then

# Scores are float32 sums of log-probabilities computed by different kernels: equal to this
SCORE_ATOL, SCORE_RTOL = 2e-4, 1e-5


@pytest.fixture(scope="module")
def tiny_eos():
    return build_tiny_llama(seed=0, config=dataclasses.replace(TINY_CONFIG,
                                                                eos_token_ids=TINY_EOS))


@pytest.fixture(scope="module")
def hf_tiny(tiny_eos):
    return hf_model_like(tiny_eos, torch.float32, torch.device("cpu"))


def hf_beam_search(hf, prompt: list[int], width: int, max_tokens: int, eos: tuple[int, ...],
                   length_penalty: float = 1.0, early_stopping=False) -> list[tuple]:
    """HF's result as [(generated tokens up to and with EOS, score)], best first. Width 1 is
    HF's greedy search: its score is computed from its logits by the same formula."""
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=width,
                      num_return_sequences=width, do_sample=False, max_new_tokens=max_tokens,
                      length_penalty=length_penalty, early_stopping=early_stopping,
                      eos_token_id=list(eos), pad_token_id=eos[0], output_logits=True,
                      output_scores=True, return_dict_in_generate=True)
    results = []
    for k, seq in enumerate(out.sequences.tolist()):
        gen = seq[len(prompt):]
        ends = [i for i, t in enumerate(gen) if t in eos]
        gen = gen[: ends[0] + 1] if ends else gen
        if width == 1:
            logprobs = [torch.log_softmax(step[0].float(), -1)[t].item()
                        for step, t in zip(out.logits, gen)]
            score = beam_score(sum(logprobs), len(gen), length_penalty)
        else:
            score = out.sequences_scores[k].item()
        results.append((gen, score))
    return results


def assert_same_beams(ours: list[tuple], ref: list[tuple], what: str) -> None:
    """Equal sequences and scores, rank by rank; where the reference's scores tie (within the
    tolerance), the tied sequences may come in either order."""
    assert len(ours) == len(ref), what
    for (_, a), (_, b) in zip(ours, ref):
        assert a == pytest.approx(b, rel=SCORE_RTOL, abs=SCORE_ATOL), f"{what}: {ours} != {ref}"
    i = 0
    while i < len(ref):  # runs of tied scores
        j = i + 1
        while j < len(ref) and abs(ref[j][1] - ref[i][1]) <= SCORE_ATOL:
            j += 1
        assert sorted(t for t, _ in ours[i:j]) == sorted(t for t, _ in ref[i:j]), (
            f"{what}, ranks {i}..{j - 1}: {ours} != {ref}")
        i = j


def beams_of(output) -> list[tuple]:
    """[(generated tokens, score)] of a RequestOutput of a beam search."""
    return [(o.token_ids, o.cumulative_logprob) for o in output.outputs]


def check_every_step(llm: LLM, check=None) -> None:
    """Run the engine's integrity check (and `check(engine)`) after every step."""
    engine = llm.llm_engine
    step = engine.step

    def checked():
        out = step()
        engine.check_integrity()
        if check is not None:
            check(engine)
        return out

    engine.step = checked


def assert_all_free(llm: LLM) -> None:
    kv = llm.llm_engine.kv_manager
    kv.check_integrity()
    assert kv.num_free_blocks == kv.num_blocks and not kv.req_to_blocks


# --------------------------------------------------------------------------- slot assignment
def test_assign_slots_examples_and_device_agrees():
    assert assign_slots([1, 1, 0, 1]) == [1, 2, 0, 3]
    assert assign_slots([0, 1, 2, 3]) == [0, 1, 2, 3]
    assert assign_slots([3, 3, 3, 3]) == [3, 0, 1, 2]
    rng = random.Random(0)
    for width in (1, 2, 3, 4, 8):
        parents = [[rng.randrange(width) for _ in range(width)] for _ in range(64)]
        got = device_beams.assign_slots(torch.tensor(parents)).tolist()
        want = [assign_slots(p) for p in parents]
        assert got == want
        for p, slots in zip(parents, want):
            assert sorted(slots) == list(range(width))  # a permutation
            for r, s in enumerate(slots):  # a parent's first child keeps its slot
                if p[r] not in p[:r]:
                    assert s == p[r]


def test_num_candidates_and_score():
    assert num_beam_candidates(4, 0) == num_beam_candidates(4, 1) == 8
    assert num_beam_candidates(4, 2) == 12
    assert beam_score(-6.0, 3, 1.0) == -2.0 and beam_score(-6.0, 4, 0.0) == -6.0


# --------------------------------------------------------------------------- HF parity, tiny
TINY_VARIANTS = [(1, 1.0, False), (2, 1.0, False), (4, 0.5, True), (4, 2.0, "never"),
                 (3, -1.0, False), (8, 1.0, "never")]


def test_tiny_model_matches_hf_every_variant(tiny_eos, hf_tiny, scheduling):
    """Widths 1-8, length penalties below, at and above 0, early_stopping True / False /
    "never", two EOS ids, prompts of 3-45 tokens: all in one engine batch (searches of
    different widths share steps with each other and with an n = 2 sampled request), each
    search the same as HF's run alone."""
    rng = random.Random(1)
    prompts = [[rng.randrange(384) for _ in range(rng.randint(3, 45))] for _ in range(4)]
    cases = [(p, v) for p in prompts for v in TINY_VARIANTS]
    params = [BeamSearchParams(beam_width=w, max_tokens=12, length_penalty=lp,
                               early_stopping=es).to_sampling_params()
              for _, (w, lp, es) in cases]
    params.append(SamplingParams(n=2, temperature=0.0, max_tokens=12, ignore_eos=True))
    llm = LLM(tiny_eos, num_kv_blocks=1024, block_size=8)
    check_every_step(llm)
    outs = llm.generate([p for p, _ in cases] + [prompts[0]], params, use_tqdm=False)
    num_eos = 0
    for (prompt, (w, lp, es)), out in zip(cases, outs):
        ref = hf_beam_search(hf_tiny, prompt, w, 12, TINY_EOS, lp, es)
        assert_same_beams(beams_of_scored(out, lp), ref, f"W={w} lp={lp} es={es} {prompt}")
        num_eos += sum(o.finish_reason == "stop" for o in out.outputs)
    assert num_eos >= 10, "too few hypotheses ended on EOS to test it"
    assert_all_free(llm)


def beams_of_scored(output, length_penalty: float) -> list[tuple]:
    return [(o.token_ids, beam_score(o.cumulative_logprob, len(o.token_ids), length_penalty))
            for o in output.outputs]


# --------------------------------------------------------------------------- HF parity, SmolLM2
@pytest.fixture(scope="module")
def smol_prompts(smollm2) -> list[list[int]]:
    """A chat question whose best beams end on EOS within 10 tokens, a raw text start, code."""
    tok = smollm2.tokenizer
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer with one word."}],
        tokenize=False, add_generation_prompt=True)
    return [tok.encode(chat), tok.encode("The capital of France is"),
            tok.encode("def fibonacci(n):")]


SMOL_WIDTHS = (1, 2, 4, 8)
SMOL_MAX_TOKENS = 10


@pytest.fixture(scope="module")
def smol_reference(hf_smollm2, smollm2, smol_prompts) -> dict:
    eos = tuple(smollm2.model_config.eos_token_ids)
    return {(i, w): hf_beam_search(hf_smollm2, p, w, SMOL_MAX_TOKENS, eos)
            for i, p in enumerate(smol_prompts) for w in SMOL_WIDTHS}


def test_smollm2_matches_hf_alone_and_batched(smollm2, smol_prompts, smol_reference):
    """SmolLM2-135M fp32: widths 1, 2, 4, 8 over three prompts (one ends on EOS early), each
    search alone and all twelve in one batch: sequences and scores as HF's."""
    llm = LLM(smollm2, num_kv_blocks=512)
    check_every_step(llm)
    cases = [(i, w) for i in range(len(smol_prompts)) for w in SMOL_WIDTHS]
    batched = llm.generate([smol_prompts[i] for i, _ in cases],
                           [BeamSearchParams(w, SMOL_MAX_TOKENS).to_sampling_params()
                            for _, w in cases], use_tqdm=False)
    for (i, w), out in zip(cases, batched):
        assert_same_beams(beams_of_scored(out, 1.0), smol_reference[i, w], f"batched {i} W={w}")
    for i, w in cases:
        (alone,) = llm.beam_search([smol_prompts[i]], BeamSearchParams(w, SMOL_MAX_TOKENS))
        ours = [(s.tokens[len(smol_prompts[i]):], s.score) for s in alone.sequences]
        assert_same_beams(ours, smol_reference[i, w], f"alone {i} W={w}")
        assert all(s.tokens[:len(smol_prompts[i])] == smol_prompts[i] for s in alone.sequences)
    ended = [o.finish_reason for o in batched[SMOL_WIDTHS.index(4)].outputs]
    assert ended[0] == "stop" and len(batched[SMOL_WIDTHS.index(4)].outputs[0].token_ids) < (
        SMOL_MAX_TOKENS), "the chat prompt's best beam should end on EOS early"
    assert_all_free(llm)


def test_width_one_is_greedy(smollm2, smol_prompts):
    llm = LLM(smollm2, num_kv_blocks=256)
    greedy = llm.generate(smol_prompts, SamplingParams(temperature=0.0, max_tokens=12),
                          use_tqdm=False)
    beams = llm.beam_search(smol_prompts, BeamSearchParams(beam_width=1, max_tokens=12))
    for prompt, g, b in zip(smol_prompts, greedy, beams):
        (seq,) = b.sequences
        assert seq.tokens == prompt + g.outputs[0].token_ids
        assert seq.finish_reason == g.outputs[0].finish_reason
        assert seq.text == llm.get_tokenizer().decode(seq.tokens, skip_special_tokens=True)
    assert_all_free(llm)


# --------------------------------------------------------------------------- memory, preemption
def test_memory_bound_sharing_stats_and_prefix_cache(tiny_eos, scheduling):
    """After every step, the blocks a search holds stay within the prompt's full blocks plus
    W x (blocks of the generated tail + 1); beams share blocks (stats show it); a second
    search of the same prompt hits the prefix cache and finds the same beams; every block is
    free at the end."""
    bs, width = 8, 4
    rng = random.Random(2)
    prompts = [[rng.randrange(384) for _ in range(n)] for n in (21, 40)]
    llm = LLM(tiny_eos, num_kv_blocks=256, block_size=bs)
    engine = llm.llm_engine
    seen = {"shared": 0, "steps": 0}

    def bound(engine):
        for head in engine.requests.values():
            group = head.group
            if len(group) < width or any(s.is_finished for s in group):
                continue
            held = {b.block_id for s in group
                    for b in engine.kv_manager.req_to_blocks.get(s.request_id, ())}
            generated = len(head.output_token_ids)
            limit = head.num_prompt_tokens // bs + width * (-(-generated // bs) + 1)
            assert len(held) <= limit, (head, len(held), limit)
            seen["steps"] += 1
        stats = engine.stats()
        seen["shared"] = max(seen["shared"], stats["num_beam_shared_blocks"])
        assert stats["num_beam_blocks"] <= stats["num_beam_block_refs"]

    check_every_step(llm, bound)
    params = BeamSearchParams(beam_width=width, max_tokens=30, ignore_eos=True)
    first = llm.beam_search(prompts, params)
    # at least the prompts' full blocks are shared while both searches run
    assert seen["steps"] > 20 and seen["shared"] >= 21 // bs + 40 // bs
    again = llm.generate(prompts[1], params.to_sampling_params(), use_tqdm=False)[0]
    assert again.num_cached_tokens == (len(prompts[1]) - 1) // bs * bs
    assert [o.token_ids for o in again.outputs] == [
        s.tokens[len(prompts[1]):] for s in first[1].sequences]
    assert_all_free(llm)
    assert engine.stats()["num_beam_searches"] == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_gives_the_same_beams(tiny_eos, scheduling, mode):
    """Beam searches and sampled requests in a cache too small for all of them: searches are
    preempted whole (by recompute, also in swap mode) and resumed, and every search finds the
    beams it finds with ample memory."""
    rng = random.Random(3)
    shared = [rng.randrange(384) for _ in range(16)]
    prompts = [shared + [rng.randrange(384) for _ in range(rng.randint(3, 30))]
               for _ in range(8)]
    beam = BeamSearchParams(beam_width=4, max_tokens=14)
    params = [beam.to_sampling_params() if i % 2 == 0 else
              SamplingParams(n=2, temperature=0.0, max_tokens=14, ignore_eos=True)
              for i in range(len(prompts))]
    ample = LLM(tiny_eos, num_kv_blocks=400, block_size=8).generate(prompts, params,
                                                                    use_tqdm=False)
    small = LLM(tiny_eos, num_kv_blocks=30, block_size=8, max_num_batched_tokens=48,
                preemption_mode=mode,
                swap_space_bytes=64 * kv_bytes_per_block(TINY_CONFIG, 8, torch.float32))
    check_every_step(small)
    outs = small.generate(prompts, params, use_tqdm=False)
    stats = small.stats()
    assert stats["num_preemptions_recompute"] > 0
    assert stats["num_chunked_prefill_steps"] > 0
    for i, (a, b) in enumerate(zip(outs, ample)):
        if i % 2 == 0:
            assert_same_beams(beams_of(a), beams_of(b), f"search {i}")
        else:
            assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert_all_free(small)


def test_abort_frees_every_slot(tiny_eos, scheduling):
    llm = LLM(tiny_eos, num_kv_blocks=128, block_size=8)
    engine = llm.llm_engine
    engine.add_request("b", list(range(30)),
                       BeamSearchParams(beam_width=4, max_tokens=20).to_sampling_params())
    for _ in range(4):
        engine.step()
    assert len(engine.requests["b"].group) == 4
    assert engine.abort_request("b")
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    engine.check_integrity()
    assert_all_free(llm)
    assert engine.model_runner.batch.row_of == {}


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,message", [
    ({"beam_width": 0, "max_tokens": 4}, "beam_width=0"),
    ({"beam_width": 2, "max_tokens": 0}, "max_tokens=0"),
    ({"beam_width": 2, "max_tokens": 4, "temperature": 0.7}, "temperature=0.7"),
    ({"beam_width": 2, "max_tokens": 4, "early_stopping": "sometimes"}, "early_stopping"),
    ({"beam_width": 2, "max_tokens": 4, "length_penalty": float("nan")}, "length_penalty"),
])
def test_bad_beam_search_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BeamSearchParams(**kwargs)


def test_beam_search_refuses_sampling_settings_and_oversized_searches(tiny_eos):
    beam = BeamSearchParams(beam_width=2, max_tokens=4)
    with pytest.raises(ValueError, match="top_p=0.5 cannot go with beam search"):
        SamplingParams(n=2, temperature=0.0, max_tokens=4, top_p=0.5, beam_search=beam)
    with pytest.raises(ValueError, match="differ from beam_search"):
        SamplingParams(n=3, temperature=0.0, max_tokens=4, beam_search=beam)
    llm = LLM(tiny_eos, num_kv_blocks=16, block_size=8, max_num_seqs=8)
    with pytest.raises(ValueError, match="beam_width=9 exceeds max_num_seqs=8"):
        llm.beam_search([[1, 2, 3]], BeamSearchParams(beam_width=9, max_tokens=4))
    with pytest.raises(ValueError, match=r"needs up to 26 KV blocks .* has 16 blocks"):
        llm.beam_search([[1] * 20], BeamSearchParams(beam_width=8, max_tokens=20))
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search([[1, 2]], SamplingParams())
    assert not llm.llm_engine.has_unfinished_requests()
