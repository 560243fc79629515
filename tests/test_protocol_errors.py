"""The server's 400 for a request body pydantic refuses (`api_error_from_validation`): the
field named as `param`, and for a field of several types one message naming the value and
the types (a fresh-user trial got "stop.str: Input should be a valid string (and 1 more
errors)" for "stop": 5)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pagedrt.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    api_error_from_validation,
)


def _error(model, body: dict):
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    error = api_error_from_validation(e.value)
    assert error.status_code == 400
    return error.body()["error"]


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"prompt": "hi", "stop": 5}, "stop", "stop=5 must be one of: str, list[str]"),
    # a value of one member's shape with a bad item: that item named, not the union (it
    # read "stop=['a', 5] must be one of: str, list[str]")
    ({"prompt": "hi", "stop": ["a", 5]}, "stop", "stop.1=5: Input should be a valid string"),
    # a value of no member's shape, or of several members' shapes: the union
    ({"prompt": [[1, "a"]]}, "prompt",
     "prompt=[[1, 'a']] must be one of: str, list[str], list[int], list[list[int]]"),
    ({"prompt": 5.5}, "prompt",
     "prompt=5.5 must be one of: str, list[str], list[int], list[list[int]]"),
    ({"prompt": "hi", "max_tokens": "x"}, "max_tokens",
     "max_tokens='x': Input should be a valid integer"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature",
     "temperature='hot': Input should be a valid number"),
    ({"prompt": "hi", "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options",
     "stream_options.include_usage='yes': Input should be a valid boolean"),
    ({}, "prompt", "prompt: Field required"),  # a missing field: no value to show
])
def test_completion_bodies(body, param, message):
    error = _error(CompletionRequest, body)
    assert (error["param"], error["message"], error["type"]) == (
        param, message, "invalid_request_error")


def test_a_long_value_is_cut():
    error = _error(ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}],
                                           "stop": {"k": "v" * 500}})
    assert error["param"] == "stop" and len(error["message"]) < 120, error


@pytest.mark.parametrize(("message", "expected"), [
    # a nested field of several types: named with its path, the value and the types (a
    # fresh-user trial got "messages.0.content.str=5: Input should be a valid string (and 1
    # more errors)")
    ({"role": "user", "content": 5},
     "messages.0.content=5 must be one of: str, a list of {'type': 'text', 'text': ...} parts"),
    # content parts: the bad part named (a trial got the union's message for each)
    ({"role": "user", "content": [{"type": "text", "text": 5}]},
     "messages.0.content.0.text=5: Input should be a valid string"),
    ({"role": "user", "content": [{"text": "hi"}]}, "messages.0.content.0.type: Field required"),
    ({"role": "user", "content": [{"type": "text", "text": "a"}, 5]},
     "messages.0.content.1=5: Input should be a valid dictionary"),  # (no class name of ours)
    # no parts: refused as OpenAI does (a trial's empty turn was answered for 1,404 tokens)
    ({"role": "user", "content": []},
     ("messages.0.content=[]: an empty list of content parts: give at least one "
      "{'type': 'text', 'text': ...} part, or the text as a string")),
    # OpenAI's roles only (a trial's "wizard" generated as if it were a role)
    ({"role": "wizard", "content": "hi"},
     ("messages.0.role='wizard': Input should be 'system', 'developer', 'user', 'assistant' or "
     "'tool'")),
    # errors in two fields of one message are not a union's members: the first is named
    # (it read "messages.0=5 must be one of: role, content")
    ({"role": 5, "content": 5},
     ("messages.0.role=5: Input should be 'system', 'developer', 'user', 'assistant' or "
      "'tool' (and 2 more errors)")),
    # null content only for an assistant's message (a trial's null user message generated
    # from empty text); the validator's own words, without pydantic's "Value error, "
    ({"role": "user", "content": None},
     ("messages.0={'role': 'user', 'content': None}: a user message needs content (null is "
     "allowed only for an assistant's message)")),
])
def test_chat_message_bodies(message, expected):
    error = _error(ChatCompletionRequest, {"messages": [message]})
    assert (error["param"], error["message"]) == ("messages", expected)


def test_an_assistant_message_may_have_null_content():
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"},
                         {"role": "developer", "content": "be brief"}]}
    messages = ChatCompletionRequest.model_validate(body).messages
    assert [m.to_template_dict() for m in messages] == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
        {"role": "developer", "content": "be brief"}]
