"""Stream chunks: the template-built SSE event equals the dict-built one, in both APIs."""

from __future__ import annotations

import json

import pytest

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
