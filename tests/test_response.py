"""Stream chunks: the template-built SSE event equals the dict-built one, in both APIs."""

from __future__ import annotations

import json

import pytest

from pagedrt.engine.sampler import TokenLogprobs
from pagedrt.entrypoints.response import ResponseBuilder
from pagedrt.outputs import CompletionOutput


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_template_sse_equals_the_dict_chunk(kind):
    builder = ResponseBuilder(None, 'model "x"')
    fast_state = builder.stream(kind, "cmpl-1", n=2, num_prompts=2)
    slow_state = builder.stream(kind, "cmpl-1", n=2, num_prompts=2)
    slow_state.created = fast_state.created
    for prompt_index, index, text in [(0, 0, "plain"), (1, 1, 'quote " backslash \\ é 😀\n')]:
        o = CompletionOutput(index=index, text="", token_ids=[1], delta_text=text)
        fast = fast_state.text_sse(prompt_index, o)
        assert fast.startswith("data: ") and fast.endswith("\n\n")
        assert json.loads(fast[len("data: "):]) == slow_state.update_one(prompt_index, o)[0]


def test_template_sse_leaves_other_chunks_to_the_dict_path():
    state = ResponseBuilder(None, "m").stream("completion", "cmpl-1", n=1, num_prompts=1)
    assert state.text_sse(0, CompletionOutput(0, "", [1], "length", delta_text="x")) is None
    assert state.text_sse(0, CompletionOutput(0, "", [1], logprobs=[], delta_text="x")) is None
    assert state.text_sse(0, CompletionOutput(0, "", [1], delta_text="")) is None


class _Chars:
    """A tokenizer whose token i decodes to chr(97 + i) ("a", "b", ...), 7 and 8 both to "h"."""

    def decode(self, ids):
        return "".join("h" if i in (7, 8) else chr(97 + i) for i in ids)


def test_completion_top_logprobs_hold_the_chosen_token():
    builder = ResponseBuilder(_Chars(), "m")
    inside = TokenLogprobs(1, -0.5, 2, [(0, -0.2), (1, -0.5)])
    outside = TokenLogprobs(5, -4.0, 9, [(0, -0.2), (1, -0.5)])
    alone = TokenLogprobs(3, -1.5, 2, [])
    same_text = TokenLogprobs(8, -3.0, 3, [(7, -1.0)])
    lp = builder.completion_logprobs([inside, outside, alone, same_text], 0)
    assert lp["top_logprobs"] == [{"a": -0.2, "b": -0.5}, {"a": -0.2, "b": -0.5, "f": -4.0},
                                  {"d": -1.5}, {"h": -1.0}]
    assert list(lp["top_logprobs"][1]) == ["a", "b", "f"]  # most likely first, chosen last
    # echoed prompt tokens: the first has nothing before it; num_top cuts the longer list
    head, end = builder.echo_logprobs([2, 1, 5], [None, inside, outside], num_top=1)
    assert head["top_logprobs"] == [None, {"a": -0.2, "b": -0.5}, {"a": -0.2, "f": -4.0}]
    assert head["token_logprobs"] == [None, -0.5, -4.0] and end == 3
    # chat's lists keep exactly the asked number
    chat = builder.chat_logprobs([outside])["content"][0]
    assert [t["token"] for t in chat["top_logprobs"]] == ["a", "b"]
