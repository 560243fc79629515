"""Request checks against the engine's limits (pagedrt/engine/validation.py) and the
max_model_len bound at construction: each error names the value and a fix that can be taken."""

import re
import types

import numpy as np
import pytest

from pagedrt.distributed.executor import resolve_max_model_len
from pagedrt.engine.validation import EngineLimits, validate_prompt
from pagedrt.sampling_params import SamplingParams


def limits(max_model_len: int, max_position_embeddings: int | None) -> EngineLimits:
    return EngineLimits(vocab_size=100, max_model_len=max_model_len, num_blocks=1000,
                        block_size=16, max_num_seqs=8,
                        max_position_embeddings=max_position_embeddings)


def test_a_long_prompt_names_how_far_max_model_len_can_rise():
    with pytest.raises(ValueError, match=r"more than max_model_len=64; shorten it or raise "
                       r"max_model_len \(`--max-model-len` on the command line, up to the "
                       r"model's max_position_embeddings=256\)"):
        validate_prompt([1] * 65, SamplingParams(max_tokens=1), limits(64, 256))


def test_a_long_prompt_at_the_models_own_limit_says_only_shorten_it():
    with pytest.raises(ValueError, match=r"more than max_model_len=256; shorten it \("
                       r"max_model_len is already the model's max_position_embeddings=256\)$"):
        validate_prompt([1] * 257, SamplingParams(max_tokens=1), limits(256, 256))


def test_a_prompt_of_exactly_max_model_len_leaves_no_room_whatever_max_tokens():
    """Not "lower max_tokens": the prompt alone fills max_model_len (the chat endpoint's
    default max_tokens, what fits, is then 1, which the client never sent)."""
    for max_tokens in (1, 5):
        with pytest.raises(ValueError, match=r"^prompt has 64 tokens, all of max_model_len=64, "
                           r"which leaves no room for a generated token; shorten it or raise"):
            validate_prompt([1] * 64, SamplingParams(max_tokens=max_tokens), limits(64, 256))
    validate_prompt([1] * 63, SamplingParams(max_tokens=1), limits(64, 256))  # (fits)


def test_a_long_prompt_without_a_known_bound_still_says_raise_it():
    with pytest.raises(ValueError, match=r"shorten it or raise max_model_len "
                       r"\(`--max-model-len` on the command line\)$"):
        validate_prompt([1] * 65, SamplingParams(max_tokens=1), limits(64, None))


def test_a_prompt_that_fits_passes():
    validate_prompt([1] * 63, SamplingParams(max_tokens=1), limits(64, 256))


def test_max_model_len_past_the_model_names_the_bound_and_the_flag():
    config = types.SimpleNamespace(max_model_len=99999)
    model = types.SimpleNamespace(max_position_embeddings=8192)
    with pytest.raises(ValueError, match=r"max_model_len=99999 exceeds the model's "
                       r"max_position_embeddings=8192; pass at most that \(`--max-model-len`"):
        resolve_max_model_len(config, model)
    assert resolve_max_model_len(types.SimpleNamespace(max_model_len=None), model) == 8192


def test_max_tokens_none_is_as_many_as_fit_per_prompt():
    """vLLM's max_tokens=None: up to max_model_len, or the whole KV cache where it holds
    fewer tokens, less each prompt's; the params given stay as they were."""
    from pagedrt.engine.validation import max_tokens_that_fit, resolve_max_tokens

    params = SamplingParams(max_tokens=None, min_tokens=3)
    roomy = limits(64, 256)  # 1,000 blocks of 16: max_model_len binds
    assert resolve_max_tokens([1] * 10, params, roomy).max_tokens == 54
    assert resolve_max_tokens([1] * 63, SamplingParams(max_tokens=None), roomy).max_tokens == 1
    assert params.max_tokens is None
    assert resolve_max_tokens([1] * 10, SamplingParams(max_tokens=5), roomy).max_tokens == 5
    small = EngineLimits(vocab_size=100, max_model_len=4096, num_blocks=4, block_size=16,
                         max_num_seqs=8, max_position_embeddings=None)  # 64 tokens bind
    assert max_tokens_that_fit(10, small) == 54
    validate_prompt([1] * 10, resolve_max_tokens([1] * 10, params, small), small)
    with pytest.raises(ValueError, match=r"min_tokens=3 exceeds max_tokens=1"):
        resolve_max_tokens([1] * 63, params, roomy)  # (only one token fits)
    with pytest.raises(ValueError, match=r"max_tokens=None is set per prompt"):
        validate_prompt([1] * 10, params, roomy)


def test_llm_generate_with_max_tokens_none_fills_max_model_len():
    """The API end of it: each prompt of a batch runs to max_model_len (ignore_eos), and
    LLMEngine.add_request resolves it too."""
    from tiny_model import build_tiny_llama

    from pagedrt import LLM

    llm = LLM(build_tiny_llama(), num_kv_blocks=64, block_size=8, max_model_len=40)
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    outs = llm.generate([[1, 2, 3], [4] * 17], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [37, 23]
    request = llm.llm_engine.add_request("r", [5] * 30, params)
    assert request.params.max_tokens == 10 and params.max_tokens is None
    llm.llm_engine.abort_request("r")


def test_an_echo_only_prompt_is_bounded_by_its_one_step_and_worded_for_max_tokens_0():
    """Echo-only scoring runs as max_tokens=1: the same bound as any prompt + max_tokens,
    worded for the max_tokens=0 the client sent; without echo_only the usual wording."""
    params = SamplingParams(max_tokens=1)
    validate_prompt([1] * 63, params, limits(64, 256), echo_only=True)
    for n in (64, 65):
        with pytest.raises(ValueError, match=(
                rf"^prompt has {n} tokens; with echo=true and max_tokens=0 it may have at most "
                r"max_model_len - 1 = 63 \(the prompt is scored by one engine step")):
            validate_prompt([1] * n, params, limits(64, 256), echo_only=True)
    with pytest.raises(ValueError, match=r"^prompt \(63 tokens\) \+ max_tokens \(2\) = 65 "
                       r"exceeds max_model_len=64"):
        validate_prompt([1] * 63, SamplingParams(max_tokens=2), limits(64, 256))


@pytest.mark.parametrize("batch", [False, True])
def test_the_server_words_an_echo_only_prompt_too_long(batch):
    """The completions endpoint with echo=true and max_tokens=0: max_model_len - 1 tokens
    pass, one more is a 400 (context_length_exceeded, naming prompt and, in a batch, which)."""
    from starlette.testclient import TestClient
    from test_chat_message_fields import _Client

    from pagedrt.entrypoints.openai_server import build_app

    client = _Client([7])
    max_model_len = client.info.limits.max_model_len
    http = TestClient(build_app(client, None, "m"), base_url="http://127.0.0.1")
    fits, long = [1] * (max_model_len - 1), [1] * max_model_len

    def post(prompt):
        return http.post("/v1/completions", json={"prompt": [fits, prompt] if batch else prompt,
                                                  "max_tokens": 0, "echo": True})

    r = post(fits)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 0
    r = post(long)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert error["message"] == (
        f"{'prompt[1]: ' if batch else ''}prompt has {max_model_len} tokens; with echo=true and "
        f"max_tokens=0 it may have at most max_model_len - 1 = {max_model_len - 1} (the prompt "
        "is scored by one engine step, which makes a token)")


@pytest.mark.parametrize("priority, match", [
    ([0], "1 priorities for 3 prompts"),
    (["a", 0, 1], "priority='a' must be an int"),
    ([None, 0, 1], "priority=None must be an int"),
    ([float("nan"), 0, 1], "priority=nan must be an int"),
    ([True, 0, 0], "priority=True must be an int"),
    (5, "priority=5 must be a list of ints"),
    ({0: 1, 1: 2, 2: 0}, "must be a list of ints"),  # (iterating a dict gives its keys)
])
def test_bad_priorities_are_refused_before_anything_is_queued(tiny, priority, match):
    """LLM.generate's priority list: one int per prompt, checked before any request is queued
    (before, a short list dropped the prompts past it, and a string was queued and broke every
    later step with a TypeError); the engine stays usable and lower values run first."""
    from pagedrt import LLM, SamplingParams

    llm = LLM(tiny, num_kv_blocks=32, block_size=8, max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    with pytest.raises(ValueError, match=re.escape(match)):
        llm.generate([[1, 2], [3], [4]], params, priority=priority, use_tqdm=False)
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="priority='x' must be an int"):
        engine.add_request("r", [1, 2], params, priority="x")
    assert not engine.has_unfinished_requests()
    finished = []
    llm.llm_engine.step = _recording(engine.step, finished)
    out = llm.generate([[1, 2], [3], [4]], params, priority=np.array([2, 0, 1]),
                       use_tqdm=False)  # (an array of ints is a list of them)
    assert [len(o.outputs[0].token_ids) for o in out] == [2, 2, 2]
    assert finished == [out[1].request_id, out[2].request_id, out[0].request_id]


def _recording(step, finished: list):
    """`step` that appends each finished output's request id to `finished`."""
    def recorded():
        outputs = step()
        finished.extend(o.request_id for o in outputs if o.finished)
        return outputs
    return recorded
