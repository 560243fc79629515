"""Request bodies of the OpenAI API (the subset pagedrt serves) and its error shape.

Bodies are validated strictly (a string is not a number, a bool is not an int, every float is
finite), as OpenAI's own server does; unknown fields are ignored so that clients sending newer fields keep working,
except the fields that would change the output and that pagedrt does not build
(unsupported_fields.py): those are a 400 naming the field.
Every rejection becomes `APIError`, rendered as

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

Ranges are not checked here: `SamplingParams` and `LLMEngine.validate_prompt` own them, and
their `ValueError`s are mapped to 400 by `api_error_from_value_error`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pagedrt.entrypoints.unsupported_fields import unsupported_field
from pagedrt.sampling_params import BeamSearchParams, SamplingParams, short_repr


class APIError(Exception):
    """An error the client caused (4xx) or the server hit (5xx), in OpenAI's shape. Unless
    given, `type` is "invalid_request_error" for a 4xx and "server_error" for a 5xx, and a
    503's `code` is "service_unavailable" (the engine core is not running, or the server is
    shutting down: README's error table)."""

    def __init__(self, status_code: int, message: str, type: str | None = None,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        if type is None:
            type = "invalid_request_error" if status_code < 500 else "server_error"
        if code is None and status_code == 503:
            code = "service_unavailable"
        self.message, self.type, self.param, self.code = message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


UNSUPPORTED = "unsupported_parameter"
"""The error `code` of a field this server does not build (OpenAI's code for a parameter a model
does not take)."""


# "temperature=-1 must be >= 0", "logit_bias[5]=150 must be ...": SamplingParams messages
# start with the field's name.
_FIELD_RE = re.compile(r"^(\w+)(?:=|\[)")
# the body's name of a field named otherwise in the Python API
_BODY_FIELDS = {"beam_width": "n"}


def api_error_from_value_error(e: ValueError, prompt_field: str) -> APIError:
    """A 400 for a ValueError of SamplingParams or LLMEngine.validate_prompt.

    `prompt_field` ("prompt" or "messages") is blamed for over-long and invalid prompts.
    """
    message = str(e)
    match = _FIELD_RE.match(message)
    if match:
        return APIError(400, message, param=_BODY_FIELDS.get(match.group(1), match.group(1)))
    if "max_model_len" in message or "KV blocks" in message:
        return APIError(400, message, param=prompt_field, code="context_length_exceeded")
    return APIError(400, message, param=prompt_field)


# a type as a client knows it, where pydantic names a class of ours
_TYPE_NAMES = {"list[ContentPart]": "a list of {'type': 'text', 'text': ...} parts"}
# how pydantic names the member of a union in an error's loc ("str", "list[int]",
# "ContentPart"), unlike a field's name (lower case, no brackets)
_UNION_MEMBER = re.compile(r"^(?:str|int|float|bool|[A-Z]\w*|[\w-]+\[.*\])$")


def api_error_from_validation(e: ValidationError) -> APIError:
    """A 400 naming the first offending field (its top-level name) and the value sent (cut by
    `short_repr`) for a pydantic error."""
    errors = e.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(e), "type": ""}
    if first.get("type") == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first['msg']}")
    loc = [str(part) for part in first.get("loc", ())]
    param = loc[0] if loc else None
    # a field of several types (stop: str | list[str]; a message's content) fails once per
    # type, each error's loc naming the field and then the type: one message naming the value
    # and the types
    field = loc[:-1]
    same_field = [err for err in errors if len(err.get("loc", ())) > len(field)
                  and [str(part) for part in err["loc"][: len(field)]] == field]
    members = list(dict.fromkeys(str(err["loc"][len(field)]) for err in same_field))
    kinds = [_TYPE_NAMES.get(member, member) for member in members]
    # (errors in two fields of one object, e.g. a tool call's id and function, are not the
    # members of a union: each is named on its own below)
    if (field and len(kinds) > 1 and len(same_field) == len(errors)
            and all(_UNION_MEMBER.match(member) for member in members)):
        # where the value has the shape of one member only (the others fail on the value as
        # a whole, this one inside it: a list with one bad item), that member's error is the
        # one to name: stop=["a", 5] -> "stop.1=5: Input should be a valid string"
        inside = [err for err in same_field if len(err["loc"]) > len(field) + 1]
        if inside and len({str(err["loc"][len(field)]) for err in inside}) == 1:
            first = dict(inside[0], loc=(*field, *inside[0]["loc"][len(field) + 1:]))
            loc = [str(part) for part in first["loc"]]
            errors = inside
        else:
            return APIError(400, f"{'.'.join(field)}={short_repr(first.get('input'))} must be "
                            f"one of: {', '.join(kinds)}", param=param)
    where = ".".join(loc) or "body"
    if loc and "input" in first and first.get("type") != "missing":  # the value, as sent
        where += f"={short_repr(first['input'])}"
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    msg = first["msg"].removeprefix("Value error, ")  # (a validator's own ValueError)
    # (a Python dict where one of our models belongs, as LLM.chat validates: pydantic's
    # "valid dictionary or instance of ContentPart" names a class the caller never sees)
    msg = re.sub(r" or instance of [A-Z]\w*", "", msg)
    return APIError(400, f"{where}: {msg}{more}", param=param)


class _Body(BaseModel):
    # NaN, Infinity and 1e400 (which JSON parsers read as infinity) are refused for every float
    # here; SamplingParams refuses them again for the Python API.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class _RefusesUnsupported(_Body):
    """A body that refuses, before its own fields are validated, the fields this server does
    not build (pagedrt/entrypoints/unsupported_fields.py): a 400 naming the field, code
    "unsupported_parameter"."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data):
        refused = unsupported_field(data)
        if refused is not None:  # (not a ValueError: pydantic passes it on as it is)
            raise APIError(400, refused[1], param=refused[0], code=UNSUPPORTED)
        return data


class StreamOptions(_Body):
    """include_usage: a last chunk with the request's usage. continuous_usage_stats (vLLM's):
    also, on every chunk with a choice, that choice's usage so far; only with include_usage
    (as in vLLM; alone it adds nothing)."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingRequest(_RefusesUnsupported):
    """Fields shared by /v1/completions and /v1/chat/completions. None means the default.

    Besides OpenAI's fields, vLLM's extensions: top_k, min_p, repetition_penalty, min_tokens,
    stop_token_ids, ignore_eos, skip_special_tokens, include_stop_str_in_output, and beam search
    (use_beam_search with n as the beam width, every beam returned as a choice, best first;
    length_penalty; early_stopping, HF's True / False / "never"). A beam search's choices
    arrive together when it ends, streamed or not. prompt_logprobs (vLLM's): the logprob of
    every prompt token but the first, with this many most likely tokens at its position, in
    the response's `prompt_logprobs` (not with stream=true, as in vLLM). logit_bias is
    OpenAI's map with token ids as strings ("1234": -100), allowed_token_ids vLLM's list;
    bad_words vLLM's list of words that may not be generated (tokenized by the API process:
    `pagedrt.engine.bad_words.resolve_bad_words`); add_special_tokens (vLLM's) is passed to
    the tokenizer for prompt texts (None: the tokenizer's default on completions; false on
    chat, whose template writes its own). truncate_prompt_tokens (vLLM's): keep the last k
    tokens of each tokenized prompt (after the chat template on chat; -1: the most that leave
    room for max_tokens; `SamplingParams.truncate_prompt_tokens`). return_tokens_as_token_ids
    (vLLM's): logprobs name tokens as "token_id:{id}" (`ResponseBuilder`). return_token_ids
    (vLLM's): the response carries the prompt's token ids (after truncate_prompt_tokens) and
    each choice's generated ones (`prompt_token_ids`, `token_ids`: response.py says where).
    stream_options: include_usage (a last chunk with the usage) and vLLM's
    continuous_usage_stats (each chunk's choice's usage so far, only together with
    include_usage: `continuous_usage_stats` below; response.py).
    """

    model: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    add_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None

    def to_sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """Raises ValueError (from SamplingParams or BeamSearchParams) naming the field and
        its allowed range; with use_beam_search, naming a sampling field that cannot go with
        it."""
        given = {name: getattr(self, name) for name in (
            "n", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
            "frequency_penalty", "repetition_penalty", "stop", "stop_token_ids", "min_tokens",
            "ignore_eos", "skip_special_tokens", "include_stop_str_in_output",
            "allowed_token_ids", "bad_words", "truncate_prompt_tokens")}
        given["logit_bias"] = _token_id_keys(self.logit_bias)
        kwargs = {name: value for name, value in given.items() if value is not None}
        if self.prompt_logprobs is not None:
            kwargs["prompt_logprobs"] = self.prompt_logprobs
        if not self.use_beam_search:
            for name in ("length_penalty", "early_stopping"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}={getattr(self, name)!r} needs use_beam_search=true")
            return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kwargs)
        beam = BeamSearchParams(
            beam_width=kwargs.pop("n", 1), max_tokens=max_tokens,
            ignore_eos=kwargs.pop("ignore_eos", False),
            temperature=kwargs.pop("temperature", 0.0),
            length_penalty=1.0 if self.length_penalty is None else self.length_penalty,
            early_stopping=False if self.early_stopping is None else self.early_stopping)
        # the sampling fields left must be defaults: SamplingParams says which is not
        return dataclasses.replace(beam.to_sampling_params(), logprobs=logprobs, **kwargs)

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data):
        # as vLLM and OpenAI refuse it (an empty or null stream_options passes, as in vLLM)
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise APIError(400, "stream_options is only allowed with stream=true; set stream "
                           "or leave stream_options out", param="stream_options")
        return data

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage_stats(self) -> bool:
        """A choice's usage so far on each of its streamed chunks: stream, include_usage and
        continuous_usage_stats all on (vLLM's rule: without include_usage, no usage)."""
        return bool(self.include_usage and self.stream_options.continuous_usage_stats)


def _token_id_keys(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias (keys: token ids as decimal strings) with int keys; ValueError
    naming a key that is not a non-negative integer."""
    if bias is None:
        return None
    for key in bias:
        if not (key.isascii() and key.isdigit()):
            raise ValueError(f"logit_bias[{short_repr(key)}]: the key must be a token id, a "
                             "non-negative integer (as a string in JSON)")
    return {int(key): value for key, value in bias.items()}


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions. `prompt`: a string, token ids, or a list of either (a batch)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class ContentPart(_Body):
    type: str
    text: str | None = None


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
"""The roles a chat message may have (OpenAI's), on the server and in `LLM.chat`."""


def tool_call_arguments(text: str) -> dict:
    """A tool call's `arguments` as a chat template gets them: the JSON object that OpenAI's
    string holds, as a dict (transformers' tool-calling templates take a dict: Llama 3.1's
    writes `arguments | tojson`, which would quote a string a second time; Qwen3-Coder's walks
    `arguments | items`, which fails on a string). Blank text is {} (a call without
    arguments), as vLLM takes it. ValueError for text that is not a JSON object (recent vLLM
    renders such arguments as {} with a warning in its log; here the client is told which
    field, instead of the model seeing a call it never made)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:  # (JSONDecodeError is a ValueError)
        raise ValueError(f"must be a JSON object in a string, as OpenAI writes a tool call's "
                         f"arguments ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004 - pydantic turns a validator's ValueError into a 400
            f"must be a JSON object in a string, as OpenAI writes a tool call's arguments, not "
            f"a JSON {type(value).__name__}")
    return value


class ToolCallFunction(_Body):
    """The function an assistant's tool call named, with its arguments as OpenAI writes them:
    a JSON object in a string."""

    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, arguments: str) -> str:
        tool_call_arguments(arguments)
        return arguments


class ToolCall(_Body):
    """One tool call of an assistant's message, in OpenAI's shape. `id` and `type` may be
    left out, as transformers' examples leave them (a missing type is "function", as vLLM
    takes it; no other type is known)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction

    def to_template_dict(self) -> dict:
        """{"id" (when given), "type", "function": {"name", "arguments": a dict}}."""
        call = {} if self.id is None else {"id": self.id}
        call["type"] = self.type
        call["function"] = {"name": self.function.name,
                            "arguments": tool_call_arguments(self.function.arguments)}
        return call


def _only_in_role(role: str, given: bool, info: ValidationInfo, rule: str) -> None:
    """ValueError "<rule>; this message's role is ..." for a ChatMessage field `given` in a
    message whose role is not `role` (no check where the role itself was refused: absent from
    info.data)."""
    actual = info.data.get("role")
    if given and actual not in (None, role):
        raise ValueError(f"{rule}; this message's role is {actual!r}")


class ChatMessage(_Body):
    """One message of a chat: OpenAI's roles ("developer" is its newer name for "system";
    "tool" carries a tool's result), content as text or text parts; null content only for an
    assistant's message (one that called tools, in OpenAI's API). `name` on any message;
    `tool_calls` (the calls an assistant made) only on an assistant's message and
    `tool_call_id` (the call a result answers) only on a tool message: set in another
    message they are refused, not dropped. An assistant's `reasoning` (vLLM's name) or
    `reasoning_content` (its older name, which Qwen3 / DeepSeek-R1 templates read): the
    reasoning of an earlier turn, text, only on an assistant's message (both given: the same
    text). Other unknown keys are ignored, as in a request body."""

    role: Literal[CHAT_ROLES]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None

    @field_validator("content")
    @classmethod
    def _some_part(cls, content):
        # (OpenAI refuses an empty array too; taken as "", it opened an empty turn that a chat,
        # whose max_tokens is as many as fit, answered at length)
        if isinstance(content, list) and not content:
            raise ValueError("an empty list of content parts: give at least one "
                             "{'type': 'text', 'text': ...} part, or the text as a string")
        return content

    @field_validator("reasoning", "reasoning_content")
    @classmethod
    def _reasoning_of_an_assistant(cls, text, info: ValidationInfo):
        _only_in_role("assistant", text is not None, info,
                      f"{info.field_name} goes only in an assistant's message")
        if (info.field_name == "reasoning_content" and text is not None
                and info.data.get("reasoning") not in (None, text)):
            raise ValueError("reasoning_content differs from reasoning (its newer name) in "
                             "this message; give one of them")
        return text

    @field_validator("tool_calls")
    @classmethod
    def _calls_of_an_assistant(cls, calls, info: ValidationInfo):
        _only_in_role("assistant", bool(calls), info,  # (null or [] says nothing)
                      "tool_calls go only in an assistant's message")
        return calls

    @field_validator("tool_call_id")
    @classmethod
    def _id_of_a_tool_result(cls, call_id, info: ValidationInfo):
        _only_in_role("tool", call_id is not None, info,
                      "tool_call_id goes only in a tool message (role 'tool', a tool's result)")
        return call_id

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (null is allowed only for "
                             "an assistant's message)")
        return self

    def to_template_dict(self) -> dict:
        """What the chat template gets: {"role", "content"} with text parts joined by newlines (other
        part types are refused; null content is ""), and the keys given of "name",
        "tool_calls" (each {"id", "type", "function": {"name", "arguments"}}, the arguments
        as a dict: `tool_call_arguments`; an empty list is left out, as vLLM does, so that a
        template takes its plain assistant path), "tool_call_id" and an assistant's
        reasoning under both "reasoning_content" (the key Qwen3 / DeepSeek-R1 templates read)
        and "reasoning" (vLLM's newer name), as vLLM passes it."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text":
                    raise APIError(400, f"content part of type {part.type!r} is not supported; "
                                   "only {'type': 'text', 'text': ...}", param="messages")
                if part.text is None:
                    raise APIError(400, "a content part of type 'text' needs its 'text' (a "
                                   "string): {'type': 'text', 'text': ...}", param="messages")
                texts.append(part.text)
            content = "\n".join(texts)  # (as vLLM joins a message's text parts)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.to_template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = reasoning
        return message


class _ChatTemplateFields(_Body):
    """vLLM's chat template fields, taken by /v1/chat/completions and /tokenize alike:
    add_generation_prompt (default true), continue_final_message (default false; needs
    add_generation_prompt false), chat_template (a Jinja string in place of the model's),
    chat_template_kwargs (the template's extra variables) and documents (a list of objects
    for RAG templates, e.g. {"title", "text"}: apply_chat_template's `documents`), rendered
    by chat_template.render_chat, which checks them."""

    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None


class ChatCompletionRequest(_SamplingRequest, _ChatTemplateFields):
    """POST /v1/chat/completions, with the chat template fields (`_ChatTemplateFields`)."""

    messages: list[ChatMessage]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_echo(cls, data):
        # (vLLM's chat echo, which leads with the last message, is not built; silently
        # dropping it would change the answer's text)
        if isinstance(data, dict) and data.get("echo") not in (None, False):
            raise APIError(400, f"echo={short_repr(data['echo'])} is not supported on chat "
                           "completions (/v1/completions takes echo=true)", param="echo",
                           code=UNSUPPORTED)
        return data


class TokenizeRequest(_RefusesUnsupported, _ChatTemplateFields):
    """POST /tokenize (vLLM's): the token ids of `prompt` as /v1/completions makes them, or of
    `messages` through the chat template as /v1/chat/completions does (exactly one of the
    two); the chat template fields (`_ChatTemplateFields`) only with messages;
    return_token_strs adds each id's token string. The fields the chat endpoint refuses
    (tools, ...: pagedrt/entrypoints/unsupported_fields.py) are refused here too."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise APIError(400, "give exactly one of prompt (a string) and messages (a chat)",
                           param="prompt" if self.prompt is not None else "messages")
        if self.messages is None:
            for name in _ChatTemplateFields.model_fields:
                if getattr(self, name) is not None:
                    raise APIError(400, f"{name} goes with messages, not prompt", param=name)
        return self


class DetokenizeRequest(_Body):
    """POST /detokenize (vLLM's): the text of token ids (special tokens kept)."""

    model: str | None = None
    tokens: list[int]
