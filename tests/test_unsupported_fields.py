"""Request bodies: the fields pagedrt does not build and that would change the output are a 400
naming the field (pagedrt/entrypoints/unsupported_fields.py), one test per category; harmless
fields are accepted; logit_bias's string keys, allowed_token_ids and bad_words reach
SamplingParams; the /tokenize and /detokenize bodies. No server
(tests/test_server_token_controls.py runs one)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from pagedrt.engine.validation import EngineLimits
from pagedrt.entrypoints.prompt_input import PromptInput
from pagedrt.entrypoints.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    api_error_from_validation,
    api_error_from_value_error,
)
from pagedrt.sampling_params import SamplingParams

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"prompt": "hi"}


def _refused(body: dict, field: str) -> str:
    """Both endpoints' bodies with `body` added refuse it: 400, `field` as the param, a
    message naming it and saying it is not supported. Returns the message."""
    messages = []
    for model, base in ((CompletionRequest, COMPLETION), (ChatCompletionRequest, CHAT)):
        with pytest.raises(APIError) as e:
            model.model_validate({**base, **body})
        error = e.value.body()["error"]
        assert e.value.status_code == 400 and error["type"] == "invalid_request_error"
        assert error["param"] == field, error
        assert error["code"] == "unsupported_parameter"  # (OpenAI's code)
        assert error["message"].startswith(field) and "is not supported" in error["message"]
        messages.append(error["message"])
    assert messages[0] == messages[1]
    return messages[0]


def _accepted(body: dict) -> None:
    CompletionRequest.model_validate({**COMPLETION, **body})
    ChatCompletionRequest.model_validate({**CHAT, **body})


@pytest.mark.parametrize("body, field", [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"guided_regex": "[a-z]+"}, "guided_regex"),
    ({"guided_choice": ["yes", "no"]}, "guided_choice"),
    ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
    ({"structured_outputs": {"json": {}}}, "structured_outputs"),
])
def test_structured_output_is_refused(body, field):
    _refused(body, field)


@pytest.mark.parametrize("body, field", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
])
def test_tool_and_function_calling_is_refused(body, field):
    assert "calling" in _refused(body, field)


@pytest.mark.parametrize("body, field", [
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"verbosity": "low"}, "verbosity"),
    ({"web_search_options": {}}, "web_search_options"),
])
def test_other_output_controls_of_openai_are_refused(body, field):
    _refused(body, field)


@pytest.mark.parametrize("body, field", [
    ({"best_of": 3}, "best_of"),
    ({"best_of": 2, "n": 1}, "best_of"),
    ({"logits_processors": ["my.module:Proc"]}, "logits_processors"),
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ({"mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs"),
])
def test_vllm_extensions_not_built_are_refused(body, field):
    _refused(body, field)


@pytest.mark.parametrize("stream, options, include, continuous", [
    (True, {"include_usage": True, "continuous_usage_stats": True}, True, True),
    (True, {"include_usage": True, "continuous_usage_stats": False}, True, False),
    (True, {"include_usage": True}, True, False),
    # vLLM's rule: continuous stats only with include_usage (alone it adds nothing)
    (True, {"continuous_usage_stats": True}, False, False),
    (True, {"include_usage": False, "continuous_usage_stats": True}, False, False),
    (True, None, False, False),
    (False, None, False, False),
    (False, {}, False, False),  # (empty: nothing asked, as vLLM lets it pass)
])
def test_continuous_usage_stats_is_served_and_needs_include_usage(stream, options, include,
                                                                  continuous):
    for model, base in ((CompletionRequest, COMPLETION), (ChatCompletionRequest, CHAT)):
        body = model.model_validate({**base, "stream": stream, "stream_options": options})
        assert body.include_usage is include
        assert body.continuous_usage_stats is continuous


@pytest.mark.parametrize("stream", [False, None])
def test_stream_options_without_stream_is_refused(stream):
    """As vLLM and OpenAI: stream_options only with stream=true (a 400 naming the field)."""
    for model, base in ((CompletionRequest, COMPLETION), (ChatCompletionRequest, CHAT)):
        body = {**base, "stream_options": {"include_usage": True}}
        if stream is not None:
            body["stream"] = stream
        with pytest.raises(APIError, match="^stream_options is only allowed with stream=true") \
                as e:
            model.model_validate(body)
        assert e.value.status_code == 400 and e.value.param == "stream_options"


def test_continuous_usage_stats_must_be_a_boolean():
    with pytest.raises(ValidationError, match="continuous_usage_stats"):
        CompletionRequest.model_validate({**COMPLETION, "stream": True, "stream_options": {
            "include_usage": True, "continuous_usage_stats": "yes"}})


@pytest.mark.parametrize("body", [
    {"user": "u1"}, {"metadata": {"k": "v"}}, {"store": False}, {"service_tier": "auto"},
    {"parallel_tool_calls": True}, {"prediction": {"type": "content", "content": "x"}},
    {"prompt_cache_key": "k"}, {"safety_identifier": "s"}, {"priority": 3},
    {"request_id": "abc"}, {"cache_salt": "salt"}, {"a_field_from_the_future": 1},
    # values of refused fields that change nothing
    {"response_format": {"type": "text"}}, {"tools": []}, {"tool_choice": "none"},
    {"functions": []}, {"function_call": "none"}, {"modalities": ["text"]},
    {"best_of": 1}, {"best_of": 2, "n": 2}, {"logits_processors": []},
    {"spaces_between_special_tokens": True}, {"continue_final_message": False},
    {"chat_template_kwargs": {}}, {"return_tokens_as_token_ids": False},
    {"return_tokens_as_token_ids": True}, {"truncate_prompt_tokens": 10},
    {"truncate_prompt_tokens": -1}, {"return_token_ids": True}, {"return_token_ids": False},
    {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": False}},
    {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    {"stream": True, "stream_options": {"continuous_usage_stats": True}},
    {"tools": None, "response_format": None, "guided_json": None},  # null: not set
])
def test_harmless_fields_are_accepted(body):
    _accepted(body)


def test_a_refused_field_is_named_before_other_errors_and_a_bad_type_still_is_a_400():
    with pytest.raises(APIError, match="^tools="):
        CompletionRequest.model_validate({"prompt": 5, "tools": [{"type": "function"}]})
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"prompt": "hi", "logit_bias": {"5": "x"}})
    assert api_error_from_validation(e.value).param == "logit_bias"


# ---------------------------------------------------------------- logit_bias, allowed ids
def test_string_keys_become_token_ids():
    body = CompletionRequest.model_validate({"prompt": "hi", "logit_bias": {"15": -100, "7": 2.5},
                                             "allowed_token_ids": [7, 15, 30]})
    params = body.to_sampling_params(16, None)
    assert params.logit_bias == {15: -100.0, 7: 2.5}
    assert params.allowed_token_ids == [7, 15, 30]


@pytest.mark.parametrize("bias, message", [
    ({"abc": 1}, "logit_bias['abc']: the key must be a token id, a non-negative integer"),
    ({"-1": 1}, "logit_bias['-1']: the key must be a token id"),
    ({" 5": 1}, "logit_bias[' 5']: the key must be a token id"),
    ({"1.5": 1}, "logit_bias['1.5']: the key must be a token id"),
    ({"\u0665": 1}, "logit_bias['\u0665']: the key must be a token id"),  # an Arabic-Indic 5
    ({"5": 100.5}, "logit_bias[5]=100.5 must be a number in [-100, 100]"),
])
def test_bad_logit_bias_is_a_400_naming_the_field(bias, message):
    body = ChatCompletionRequest.model_validate({**CHAT, "logit_bias": bias})
    with pytest.raises(ValueError) as e:
        body.to_sampling_params(16, None)
    error = api_error_from_value_error(e.value, "messages")
    assert (error.status_code, error.param) == (400, "logit_bias")
    assert error.message.startswith(message), error.message


def test_beam_search_with_logit_bias_is_a_400_naming_it():
    body = CompletionRequest.model_validate({"prompt": "hi", "use_beam_search": True, "n": 2,
                                             "logit_bias": {"5": 1}})
    with pytest.raises(ValueError) as e:
        body.to_sampling_params(8, None)
    error = api_error_from_value_error(e.value, "prompt")
    assert error.param == "logit_bias" and "cannot go with beam search" in error.message


# ---------------------------------------------------------------- bad_words
def test_bad_words_reach_sampling_params_on_both_endpoints():
    """vLLM's bad_words is served (no longer an unsupported field): the words reach
    SamplingParams as sent (the API process tokenizes them later); [] is no ban."""
    for model, base in ((CompletionRequest, COMPLETION), (ChatCompletionRequest, CHAT)):
        body = model.model_validate({**base, "bad_words": ["Paris", "the city"]})
        assert body.to_sampling_params(16, None).bad_words == ["Paris", "the city"]
        assert model.model_validate({**base, "bad_words": []}).to_sampling_params(
            16, None).bad_words is None


@pytest.mark.parametrize("words, message", [
    ([""], "bad_words[0]='' must be a non-empty string"),
    (["ok", ""], "bad_words[1]='' must be a non-empty string"),
])
def test_bad_bad_words_are_a_400_naming_the_field(words, message):
    body = ChatCompletionRequest.model_validate({**CHAT, "bad_words": words})
    with pytest.raises(ValueError) as e:
        body.to_sampling_params(16, None)
    error = api_error_from_value_error(e.value, "messages")
    assert (error.status_code, error.param) == (400, "bad_words")
    assert error.message.startswith(message), error.message


@pytest.mark.parametrize("words", ["Paris", [5], ["ok", None], {"a": 1}])
def test_bad_words_of_another_type_are_a_400_naming_the_field(words):
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({**COMPLETION, "bad_words": words})
    error = api_error_from_validation(e.value)
    assert (error.status_code, error.param) == (400, "bad_words")


def test_beam_search_with_bad_words_is_a_400_naming_it():
    body = CompletionRequest.model_validate({"prompt": "hi", "use_beam_search": True, "n": 2,
                                             "bad_words": ["x"]})
    with pytest.raises(ValueError) as e:
        body.to_sampling_params(8, None)
    error = api_error_from_value_error(e.value, "prompt")
    assert error.param == "bad_words" and "cannot go with beam search" in error.message


# ---------------------------------------------------------------- /tokenize, /detokenize bodies
@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "prompt"),
    ({"prompt": "hi", "add_generation_prompt": True}, "add_generation_prompt"),
])
def test_tokenize_takes_exactly_one_input(body, param):
    with pytest.raises(APIError) as e:
        TokenizeRequest.model_validate(body)
    assert (e.value.status_code, e.value.param) == (400, param)


@pytest.mark.parametrize("body, field", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs"),
])
def test_tokenize_refuses_what_the_chat_endpoint_refuses(body, field):
    """A template setting /tokenize ignored would give other ids than the chat endpoint."""
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(APIError) as e:
        TokenizeRequest.model_validate({"messages": messages, **body})
    assert (e.value.status_code, e.value.param, e.value.code) == (
        400, field, "unsupported_parameter")
    assert "is not supported" in e.value.message


TEMPLATE_FIELDS = {"chat_template": "{{ messages }}", "continue_final_message": True,
                   "add_generation_prompt": False,
                   "chat_template_kwargs": {"enable_thinking": False}}


def test_chat_template_fields_are_served_on_chat_and_tokenize():
    """vLLM's chat template fields reach the chat request and /tokenize's (rendered and
    checked by chat_template.render_chat: tests/test_chat_template_fields.py); /v1/completions,
    which renders no template, ignores them as vLLM does."""
    chat = ChatCompletionRequest.model_validate({**CHAT, **TEMPLATE_FIELDS})
    tokenize = TokenizeRequest.model_validate({**CHAT, **TEMPLATE_FIELDS})
    for body in (chat, tokenize):
        assert {name: getattr(body, name) for name in TEMPLATE_FIELDS} == TEMPLATE_FIELDS
    CompletionRequest.model_validate({**COMPLETION, **TEMPLATE_FIELDS})


def test_chat_echo_is_refused_and_false_is_accepted():
    with pytest.raises(APIError) as e:
        ChatCompletionRequest.model_validate({**CHAT, "echo": True})
    assert (e.value.status_code, e.value.param, e.value.code) == (
        400, "echo", "unsupported_parameter")
    assert e.value.message.startswith("echo=True is not supported on chat completions")
    ChatCompletionRequest.model_validate({**CHAT, "echo": False})
    CompletionRequest.model_validate({**COMPLETION, "echo": True})  # (completions echo)


def test_detokenize_needs_a_list_of_ints():
    assert DetokenizeRequest.model_validate({"tokens": [1, 2]}).tokens == [1, 2]
    for tokens in ("1 2", [1.5], [True]):
        with pytest.raises(ValidationError) as e:
            DetokenizeRequest.model_validate({"tokens": tokens})
        assert api_error_from_validation(e.value).param == "tokens"


class _RecordingTokenizer:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def get_vocab(self) -> dict:
        return {"a": 0, "bb": 1}

    def encode(self, text: str, **kwargs) -> list[int]:
        self.calls.append(kwargs)
        return [0] * len(text)


def test_add_special_tokens_reaches_the_tokenizer_only_when_given():
    tok = _RecordingTokenizer()
    prompt_input = PromptInput(tok, EngineLimits(2, 64, 8, 16, 8), 16)
    for value in (None, True, False):
        asyncio.run(prompt_input.encode(["abc"], "prompt", value))
    assert tok.calls == [{}, {"add_special_tokens": True}, {"add_special_tokens": False}]


def test_a_bad_prompt_in_a_batch_is_named_by_its_index(smollm2):
    """`["x", ""]` or `[[1], []]`: the 400 says which prompt, as LLM.generate does."""
    from test_stream_handler import _InstantClient

    from pagedrt.entrypoints.openai_server import OpenAIServer

    server = OpenAIServer(_InstantClient([]), smollm2.tokenizer, "m", None)
    with pytest.raises(APIError) as e:
        asyncio.run(server.prompt_input.encode(["x", ""], "prompt"))
    assert (e.value.message, e.value.param) == (
        "prompt[1] is empty; give at least one token", "prompt")
    with pytest.raises(APIError) as e:
        asyncio.run(server.prompt_input.encode([""], "prompt"))
    assert e.value.message == "prompt is empty; give at least one token"
    params = SamplingParams(max_tokens=4)
    with pytest.raises(APIError) as e:
        server._validate([[1], []], params, "prompt")
    assert e.value.message == "prompt[1]: prompt is empty; give at least one token"
    with pytest.raises(APIError) as e:
        server._validate([[1], [2, 10**6]], params, "prompt")
    assert e.value.message.startswith("prompt[1]: prompt token id 1000000 is not an int in")
    with pytest.raises(APIError) as e:
        server._validate([[]], params, "prompt")
    assert e.value.message == "prompt is empty; give at least one token"


def test_truncate_prompt_tokens_reaches_sampling_params_and_bad_values_are_a_400():
    for model, base in ((CompletionRequest, COMPLETION), (ChatCompletionRequest, CHAT)):
        body = model.model_validate({**base, "truncate_prompt_tokens": 7})
        assert body.to_sampling_params(4, None).truncate_prompt_tokens == 7
        for bad in (0, -2):
            body = model.model_validate({**base, "truncate_prompt_tokens": bad})
            with pytest.raises(ValueError) as e:
                body.to_sampling_params(4, None)
            error = api_error_from_value_error(e.value, "prompt")
            assert error.param == "truncate_prompt_tokens", error.message
            assert "k from 1 to max_model_len" in error.message
        for bad in (True, 1.5, "3"):  # (strict: not an int)
            with pytest.raises(ValidationError) as e:
                model.model_validate({**base, "truncate_prompt_tokens": bad})
            assert api_error_from_validation(e.value).param == "truncate_prompt_tokens"
