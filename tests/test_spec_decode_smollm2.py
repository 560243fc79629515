"""N-gram speculative decoding on the real SmolLM2-135M-Instruct (fp32, CPU): greedy tokens
identical to greedy without speculation for k = 1, 3, 5, on prompts whose answer repeats their
input (a paragraph to correct, a function to document) and prompts whose answer does not, in
one mixed batch and alone; a stop string inside a run of accepted drafts; and after each run no
block held and no cached block holding a rejected token."""

from __future__ import annotations

import pytest
import torch
from test_spec_decode import assert_cache_holds_no_rejected_token, assert_no_block_held, run

from pagedrt import LLM, SamplingParams

PARAGRAPH = (
    "The quick brown fox jumpd over the lazy dog while the farmer was wachting from the "
    "porch. He had bin working in the fields all day and was to tired to chase it away.")
CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    averages = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        averages.append(total / window)
    return averages
'''
QUESTIONS = [
    f"Correct the typos in this paragraph and write it out again:\n\n{PARAGRAPH}",
    f"Add a docstring to this function and write the whole function again:\n\n{CODE}",
    "Write a haiku about the ocean.",
    "What is the capital of France?",
]
MAX_TOKENS = 24


@pytest.fixture(autouse=True)
def two_threads():
    n = torch.get_num_threads()
    torch.set_num_threads(min(n, 2))
    yield
    torch.set_num_threads(n)


def make_llm(smollm2, k: int | None = None) -> LLM:
    spec = None if k is None else {"method": "ngram", "num_speculative_tokens": k,
                                   "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    return LLM(smollm2, num_kv_blocks=96, block_size=16, speculative_config=spec)


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[str]:
    llm = LLM(smollm2, num_kv_blocks=8)
    return [llm.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(smollm2, prompts):
    base = make_llm(smollm2)
    outs = run(base, prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    return base, outs


def test_greedy_tokens_identical_with_ngram_speculation(smollm2, prompts, reference):
    base, ref = reference
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected = [o.outputs[0].token_ids for o in ref]
    tokenizer = base.get_tokenizer()
    # the answers repeat the paragraph and the code (prompt lookup has something to find)
    assert "lazy dog" in ref[0].outputs[0].text and "moving_average" in ref[1].outputs[0].text
    for k in (1, 3, 5):
        llm = make_llm(smollm2, k)
        outs = run(llm, prompts, params)  # one mixed batch
        assert [o.outputs[0].token_ids for o in outs] == expected, k
        s = llm.stats()
        assert s["spec_decode_num_accepted_tokens"] > MAX_TOKENS // 2, s
        assert_no_block_held(llm)
        assert_cache_holds_no_rejected_token(llm, outs, base)
        if k == 5:
            assert s["spec_decode_mean_accepted_length"] > 2.0, s
            for prompt, tokens in zip(prompts[:3], expected):  # alone (2 repeat, 1 not)
                alone = run(llm, prompt, params)[0].outputs[0].token_ids
                assert alone == tokens, tokenizer.decode(alone)
            assert_no_block_held(llm)


def test_stop_string_inside_accepted_drafts(smollm2, prompts, reference):
    """The copied paragraph is accepted several tokens a step: a stop string in it must end
    the text exactly where plain decoding ends it."""
    _, ref = reference
    text = ref[0].outputs[0].text
    assert "lazy" in text
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=["lazy"])
    expected = make_llm(smollm2).generate(prompts[0], params, use_tqdm=False)[0].outputs[0]
    llm = make_llm(smollm2, 5)
    got = run(llm, prompts[0], params)[0].outputs[0]
    assert got.finish_reason == "stop" and got.stop_reason == "lazy"
    assert (got.text, got.token_ids) == (expected.text, expected.token_ids)
    assert got.text == text[: text.index("lazy")]
    assert llm.stats()["spec_decode_num_accepted_tokens"] > 0
    assert_no_block_held(llm)
