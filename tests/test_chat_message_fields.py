"""A chat message's fields besides role and content reach the chat template, as in vLLM: `name`,
an assistant's `tool_calls` (their arguments as a dict, as transformers' tool-calling
templates take them, not OpenAI's JSON string) and a tool message's `tool_call_id`. Until
then the server passed only {"role", "content"} and ignored the rest, so a history with tool
calls reached the model without them.

Through the server's app in this process (its engine client finishes every request at once,
tests/test_stream_handler.py), with a byte-level tokenizer whose template prints every field;
/tokenize gives the rendered prompt's ids, which decode back to its text. Then LLM.chat's
path (apply_chat_template), which takes OpenAI's form and transformers' (arguments as a
dict, no id)."""

from __future__ import annotations

import copy
import json

import pytest
from starlette.testclient import TestClient
from test_stream_handler import _InstantClient
from tiny_model import build_tiny_llama, byte_level_chat_tokenizer

from pagedrt import LLM, SamplingParams
from pagedrt.entrypoints.openai_server import build_app
from pagedrt.entrypoints.protocol import ChatMessage

# every field a template may read, the arguments through `tojson` as transformers' tool
# templates write them (Llama 3.1's, Qwen2.5's): a string there would be quoted a second time
TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m.role }}{% if m.name is defined %} name={{ m.name }}{% endif %}"
    "{{ '\\n' }}"
    "{% if m.tool_call_id is defined %}[result of {{ m.tool_call_id }}] {% endif %}"
    "{{ m.content }}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}"
    "<call id={{ c.id if c.id is defined else '-' }} type={{ c.type }}>"
    '{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</call>'
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# a history with past tool calls, as an OpenAI client sends it
TOOL_HISTORY = [
    {"role": "system", "content": "You can look up the weather."},
    {"role": "user", "content": "Weather in Paris and Lyon?", "name": "ana"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
    {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1", "name": "get_weather"},
    {"role": "tool", "content": [{"type": "text", "text": "15 C,"}, {"type": "text",
                                                                      "text": "rain"}],
     "tool_call_id": "call_2"},
]
TOOL_HISTORY_TEXT = (
    "<|im_start|>system\nYou can look up the weather.<|im_end|>\n"
    "<|im_start|>user name=ana\nWeather in Paris and Lyon?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<call id=call_1 type=function>{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": 2}}</call>'
    '<call id=call_2 type=function>{"name": "get_weather", "arguments": {"city": "Lyon"}}'
    "</call><|im_end|>\n"
    "<|im_start|>tool name=get_weather\n[result of call_1] 18 C, sunny<|im_end|>\n"
    "<|im_start|>tool\n[result of call_2] 15 C,\nrain<|im_end|>\n"  # (two parts)
    "<|im_start|>assistant\n")

PLAIN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."},
         {"role": "user", "content": [{"type": "text", "text": "Name"},
                                      {"type": "text", "text": "a planet."}]}]
PLAIN_TEXT = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello.<|im_end|>\n"
              "<|im_start|>user\nName\na planet.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def tok():
    """A byte-level tokenizer (every text round-trips; 259 ids, within the tiny model's 384)
    with TEMPLATE."""
    tok = byte_level_chat_tokenizer(TEMPLATE)
    assert tok.decode(tok.encode(TOOL_HISTORY_TEXT)) == TOOL_HISTORY_TEXT
    return tok


class _Client(_InstantClient):
    """What build_app asks of an engine client besides the handler's surface."""

    def snapshot(self) -> dict:
        return {}


@pytest.fixture(scope="module")
def http(tok):
    return TestClient(build_app(_Client([]), tok, "m"), base_url="http://127.0.0.1")


def _rendered(http, tok, messages: list, **extra) -> str:
    r = http.post("/tokenize", json={"messages": messages, **extra})
    assert r.status_code == 200, r.text
    return tok.decode(r.json()["tokens"])


def _transformers_form(messages: list) -> list:
    """The messages as transformers' docs write them: arguments as dicts, text content (a
    list's text parts joined by newlines, as vLLM joins them)."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for call in m.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(part["text"] for part in m["content"])
        if m.get("content") is None:
            m["content"] = ""
    return messages


def test_name_tool_calls_and_tool_call_id_reach_the_template(http, tok):
    assert _rendered(http, tok, TOOL_HISTORY) == TOOL_HISTORY_TEXT
    # what transformers renders for the same chat in its own form (arguments as dicts)
    assert TOOL_HISTORY_TEXT == tok.apply_chat_template(
        _transformers_form(TOOL_HISTORY), tokenize=False, add_generation_prompt=True)
    # the chat endpoint renders the same prompt (its prompt_tokens: /tokenize's count)
    count = http.post("/tokenize", json={"messages": TOOL_HISTORY}).json()["count"]
    r = http.post("/v1/chat/completions", json={"messages": TOOL_HISTORY, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == count == len(tok.encode(TOOL_HISTORY_TEXT))


def test_optional_parts_of_a_tool_call(http, tok):
    """A call without id or type (as transformers' examples write one), blank arguments
    (a call without any: {}), an empty tool_calls list (left out, as vLLM does: the template
    takes its plain path) and nulls (not set)."""
    messages = [{"role": "user", "content": "hi", "name": None},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"function": {"name": "now", "arguments": " "}}]},
                {"role": "tool", "content": "noon", "tool_call_id": None},
                {"role": "assistant", "content": "It is noon.", "tool_calls": []}]
    assert _rendered(http, tok, messages, add_generation_prompt=False) == (
        "<|im_start|>user\nhi<|im_end|>\n"
        '<|im_start|>assistant\nChecking.<call id=- type=function>{"name": "now", '
        '"arguments": {}}</call><|im_end|>\n'
        "<|im_start|>tool\nnoon<|im_end|>\n"
        "<|im_start|>assistant\nIt is noon.<|im_end|>\n")


def test_a_plain_chat_renders_as_before(http, tok):
    """Messages of role and content only: the template gets {"role", "content"} (parts
    joined), nothing more, so a template that tests for a key renders as it did."""
    conversation = [ChatMessage.model_validate(m).to_template_dict() for m in PLAIN]
    assert conversation == _transformers_form(PLAIN)
    assert all(m.keys() == {"role", "content"} for m in conversation)
    assert _rendered(http, tok, PLAIN) == PLAIN_TEXT
    assert PLAIN_TEXT == tok.apply_chat_template(_transformers_form(PLAIN), tokenize=False,
                                                 add_generation_prompt=True)


def _tool_call(arguments='{"city": "Paris"}', **fields) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": arguments},
                            **fields}]}


USER = {"role": "user", "content": "Weather?"}


@pytest.mark.parametrize(("message", "starts"), [
    (_tool_call("{city: Paris}"),
     ("messages.1.tool_calls.0.function.arguments='{city: Paris}': must be a JSON object in a "
      "string, as OpenAI writes a tool call's arguments (Expecting property name")),
    (_tool_call('["Paris"]'),
     ("messages.1.tool_calls.0.function.arguments='[\"Paris\"]': must be a JSON object in a "
      "string, as OpenAI writes a tool call's arguments, not a JSON list")),
    (_tool_call({"city": "Paris"}),  # (OpenAI refuses an object too)
     ("messages.1.tool_calls.0.function.arguments={'city': 'Paris'}: Input should be a valid "
      "string")),
    (_tool_call(type="custom"),
     "messages.1.tool_calls.0.type='custom': Input should be 'function'"),
    (_tool_call(function={"arguments": "{}"}),
     "messages.1.tool_calls.0.function.name: Field required"),
    (_tool_call(id=7), "messages.1.tool_calls.0.id=7: Input should be a valid string"),
    # two bad fields of one call: the first named (not "must be one of: id, function")
    (_tool_call(id=7, function=5),
     "messages.1.tool_calls.0.id=7: Input should be a valid string (and 1 more errors)"),
    ({"role": "assistant", "tool_calls": {"id": "call_1"}},
     "messages.1.tool_calls={'id': 'call_1'}: Input should be a valid array"),
    ({"role": "user", "content": "x", "tool_calls": _tool_call()["tool_calls"]},
     "messages.1.tool_calls=[{'id': 'call_1', "),
    ({"role": "assistant", "content": "x", "tool_call_id": "call_1"},
     ("messages.1.tool_call_id='call_1': tool_call_id goes only in a tool message (role "
      "'tool', a tool's result); this message's role is 'assistant'")),
    ({"role": "tool", "content": "18 C", "tool_call_id": 1},
     "messages.1.tool_call_id=1: Input should be a valid string"),
    ({"role": "user", "content": "x", "name": ["ana"]},
     "messages.1.name=['ana']: Input should be a valid string"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_bad_shape_is_a_400_naming_the_field(http, path, message, starts):
    r = http.post(path, json={"messages": [USER, message]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error", error
    assert error["message"].startswith(starts), error["message"]


def test_tool_calls_on_a_user_message_say_where_they_go(http):
    message = {"role": "user", "content": "x", "tool_calls": _tool_call()["tool_calls"]}
    error = http.post("/tokenize", json={"messages": [message]}).json()["error"]
    assert error["message"].endswith(": tool_calls go only in an assistant's message; this "
                                     "message's role is 'user'"), error


def test_tools_stay_refused_while_a_history_of_calls_renders(http):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    for path in ("/v1/chat/completions", "/tokenize"):
        r = http.post(path, json={"messages": TOOL_HISTORY, "tools": tools})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("tools", "unsupported_parameter"), error
        r = http.post(path, json={"messages": TOOL_HISTORY, "tool_choice": "auto"})
        assert r.json()["error"]["param"] == "tool_choice"


# ------------------------------------------------------------------ LLM.chat
@pytest.fixture(scope="module")
def llm(tok):
    return LLM(build_tiny_llama()._replace(tokenizer=tok), block_size=8, num_kv_blocks=64)


def test_llm_chat_passes_the_fields_to_the_template(llm, tok):
    # OpenAI's form, as the server takes it
    assert llm.apply_chat_template(TOOL_HISTORY) == TOOL_HISTORY_TEXT
    # transformers' form: arguments as dicts, no ids, an assistant's content left out
    hf_form = _transformers_form(TOOL_HISTORY)
    for call in hf_form[2]["tool_calls"]:
        del call["id"]
    del hf_form[2]["content"]
    assert llm.apply_chat_template(hf_form) == TOOL_HISTORY_TEXT.replace(
        "id=call_1", "id=-").replace("id=call_2", "id=-")
    # the messages are not changed in place (the arguments stay strings)
    assert TOOL_HISTORY[2]["tool_calls"][0]["function"]["arguments"] == (
        '{"city": "Paris", "days": 2}')
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    out = llm.chat(TOOL_HISTORY, params, use_tqdm=False)[0]
    assert out.prompt == TOOL_HISTORY_TEXT
    assert out.prompt_token_ids == tok.encode(TOOL_HISTORY_TEXT, add_special_tokens=False)


def test_a_template_that_walks_the_arguments(llm):
    """A template that walks `arguments | items` (Qwen3-Coder's way; on a string it fails)."""
    template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                "<function={{ c.function.name }}>"
                "{% for k, v in c.function.arguments | items %}<{{ k }}={{ v }}>{% endfor %}"
                "</function>{% endfor %}{% endfor %}")
    assert llm.apply_chat_template(TOOL_HISTORY, chat_template=template,
                                   add_generation_prompt=False) == (
        "<function=get_weather><city=Paris><days=2></function>"
        "<function=get_weather><city=Lyon></function>")


def test_llm_chat_keeps_other_keys_and_plain_chats(llm):
    """A key that is none of ChatMessage's fields reaches the template as given (as before);
    a plain chat renders as the tokenizer renders it."""
    template = "{% for m in messages %}{{ m.role }}:{{ m.content }}/{{ m.mood }};{% endfor %}"
    chat = [{"role": "user", "content": "hi", "mood": "glad"}]
    assert llm.apply_chat_template(chat, chat_template=template,
                                   add_generation_prompt=False) == "user:hi/glad;"
    assert llm.apply_chat_template(PLAIN) == PLAIN_TEXT


@pytest.mark.parametrize(("message", "match"), [
    (_tool_call("{city: Paris}"),
     r"tool_calls\.0\.function\.arguments='\{city: Paris\}': must be a JSON object"),
    (_tool_call({"when": object()}), r"tool_calls\.0\.function\.arguments: not JSON data"),
    ({"role": "user", "content": "x", "tool_call_id": "call_1"},
     r"tool_call_id='call_1': tool_call_id goes only in a tool message"),
    ({"role": "user", "name": "ana"}, r"needs 'role' and 'content'"),
])
def test_llm_chat_refuses_what_the_server_refuses(llm, message, match):
    with pytest.raises(ValueError, match=r"^chat message .*" + match):
        llm.apply_chat_template([USER, message])
