"""vLLM's chat template fields on the chat endpoint, /tokenize and LLM.chat (one rule:
pagedrt/entrypoints/chat_template.py): a per-request `chat_template` replaces the model's,
`chat_template_kwargs` reach the template as variables, `continue_final_message` leaves the
last assistant message open (no end token) so that the generation continues it,
`add_generation_prompt` false leaves out the assistant's header; each bad value is a 400
naming the field (a ValueError offline), and a plain chat renders as before.

Through the server's app in this process (its engine client answers every request with
fixed tokens: tests/test_stream_handler.py) with the byte-level tokenizer of
tests/test_chat_message_fields.py, whose template here reads `enable_thinking`."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from test_chat_message_fields import _Client
from tiny_model import build_tiny_llama, byte_level_chat_tokenizer

from pagedrt import LLM, SamplingParams
from pagedrt.entrypoints.chat_template import reserved_template_kwargs
from pagedrt.entrypoints.guards import HttpOptions
from pagedrt.entrypoints.openai_server import build_app

TRUSTED = HttpOptions(trust_request_chat_template=True)  # (--trust-request-chat-template)

# a Qwen3-like template: enable_thinking=false writes an empty think block after the header
TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}")
OTHER = ("{% for m in messages %}{{ m.role | upper }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}ASSISTANT:{% endif %}{{ greeting | default('') }}")

CHAT = [{"role": "user", "content": "Hi"}]
CHAT_TEXT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
PARTIAL = [{"role": "user", "content": "Count to three."},
           {"role": "assistant", "content": "One, two,"}]
PARTIAL_TEXT = ("<|im_start|>user\nCount to three.<|im_end|>\n"
                "<|im_start|>assistant\nOne, two,")


@pytest.fixture(scope="module")
def tok():
    return byte_level_chat_tokenizer(TEMPLATE)


CONTINUATION = " three."


@pytest.fixture(scope="module")
def http(tok):
    client = _Client(tok.encode(CONTINUATION))
    return TestClient(build_app(client, tok, "m", TRUSTED), base_url="http://127.0.0.1")


def _rendered(http, tok, messages: list, **extra) -> str:
    r = http.post("/tokenize", json={"messages": messages, **extra})
    assert r.status_code == 200, r.text
    return tok.decode(r.json()["tokens"])


def _chat(http, messages: list, **extra) -> dict:
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_plain_chat_renders_as_before(http, tok):
    assert _rendered(http, tok, CHAT) == CHAT_TEXT == tok.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True)
    assert _chat(http, CHAT)["usage"]["prompt_tokens"] == len(tok.encode(CHAT_TEXT))
    # the fields at their defaults change nothing
    defaults = {"add_generation_prompt": True, "continue_final_message": False,
                "chat_template_kwargs": {}, "chat_template": None}
    assert _rendered(http, tok, CHAT, **defaults) == CHAT_TEXT
    assert _chat(http, CHAT, **defaults)["usage"]["prompt_tokens"] == len(tok.encode(CHAT_TEXT))


def test_a_request_chat_template_replaces_the_models(http, tok):
    text = "USER: Hi\nASSISTANT:"
    assert _rendered(http, tok, CHAT, chat_template=OTHER) == text
    assert _chat(http, CHAT, chat_template=OTHER)["usage"]["prompt_tokens"] == len(
        tok.encode(text))
    # ... and takes the kwargs too
    assert _rendered(http, tok, CHAT, chat_template=OTHER,
                     chat_template_kwargs={"greeting": " Hello"}) == text + " Hello"


def test_chat_template_kwargs_reach_the_template(http, tok):
    text = CHAT_TEXT + "<think>\n\n</think>\n\n"
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    assert _rendered(http, tok, CHAT, **kwargs) == text
    assert _chat(http, CHAT, **kwargs)["usage"]["prompt_tokens"] == len(tok.encode(text))
    # a variable the template does not read changes nothing; true is the template's default
    assert _rendered(http, tok, CHAT, chat_template_kwargs={"enable_thinking": True,
                                                            "unused": [1]}) == CHAT_TEXT


def test_add_generation_prompt_false_leaves_out_the_header(http, tok):
    text = "<|im_start|>user\nHi<|im_end|>\n"
    assert _rendered(http, tok, CHAT, add_generation_prompt=False) == text
    assert _chat(http, CHAT, add_generation_prompt=False)["usage"]["prompt_tokens"] == len(
        tok.encode(text))


def test_continue_final_message_leaves_the_last_message_open(http, tok):
    fields = {"continue_final_message": True, "add_generation_prompt": False}
    assert _rendered(http, tok, PARTIAL, **fields) == PARTIAL_TEXT
    body = _chat(http, PARTIAL, **fields)
    assert body["usage"]["prompt_tokens"] == len(tok.encode(PARTIAL_TEXT))
    # the generated tokens continue the message: together they read as one
    assert "One, two," + body["choices"][0]["message"]["content"] == "One, two, three."
    # without it the message is closed and a new one begins
    closed = _rendered(http, tok, PARTIAL)
    assert closed == PARTIAL_TEXT + "<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("extra, field, starts", [
    ({"chat_template": "{% for %}"}, "chat_template", "chat_template does not parse: "),
    ({"chat_template": "{{ raise_exception('no') }}"}, "chat_template",
     "chat_template does not render: no"),
    ({"chat_template": "{{ messages[5].content }}"}, "chat_template",
     "chat_template does not render: "),
    ({"chat_template": "  "}, "chat_template", "chat_template='  ' must be a Jinja template"),
    ({"chat_template": 5}, "chat_template", "chat_template=5: Input should be a valid string"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs",
     "chat_template_kwargs=[1]: Input should be an object"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs",
     "chat_template_kwargs key 'tokenize' is not allowed"),
    ({"continue_final_message": True}, "continue_final_message",
     "continue_final_message=true needs add_generation_prompt=false"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message",
     "continue_final_message=true needs add_generation_prompt=false"),
    ({"continue_final_message": True, "add_generation_prompt": False,
      "messages": CHAT}, "continue_final_message",
     ("continue_final_message=true continues the last message, which must be the assistant's; "
     "it is 'user'")),
    ({"continue_final_message": "yes"}, "continue_final_message",
     "continue_final_message='yes': Input should be a valid boolean"),
])
@pytest.mark.parametrize("path", ["/tokenize", "/v1/chat/completions"])
def test_a_bad_value_is_a_400_naming_the_field(http, path, extra, field, starts):
    r = http.post(path, json={"messages": PARTIAL, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["type"]) == (field, "invalid_request_error")
    assert error["message"].startswith(starts), error["message"]


@pytest.mark.parametrize("key", ["tokenize", "conversation", "messages", "chat_template",
                                 "add_generation_prompt", "continue_final_message", "tools",
                                 "documents", "return_dict", "tokenizer_kwargs",
                                 "raise_exception", "bos_token", "eos_token"])
def test_kwargs_that_clash_with_apply_chat_template_are_refused(http, tok, key):
    assert key in reserved_template_kwargs(tok)
    r = http.post("/tokenize", json={"messages": CHAT, "chat_template_kwargs": {key: 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
    assert f"key {key!r} is not allowed" in r.json()["error"]["message"]


@pytest.mark.parametrize("field, value", [
    ("chat_template", OTHER), ("chat_template_kwargs", {"a": 1}),
    ("continue_final_message", False), ("add_generation_prompt", True)])
def test_tokenize_takes_the_fields_only_with_messages(http, field, value):
    r = http.post("/tokenize", json={"prompt": "hi", field: value})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": f"{field} goes with messages, not prompt",
                                 "type": "invalid_request_error", "param": field,
                                 "code": None}


def test_the_model_without_a_template_takes_a_request_template(tok):
    import copy

    untemplated = copy.deepcopy(tok)
    untemplated.chat_template = None
    http = TestClient(build_app(_Client([]), untemplated, "m", TRUSTED),
                      base_url="http://127.0.0.1")
    r = http.post("/tokenize", json={"messages": CHAT})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "send chat_template" in r.json()["error"]["message"]
    assert _rendered(http, tok, CHAT, chat_template=OTHER) == "USER: Hi\nASSISTANT:"


# ------------------------------------------------------------------ LLM.chat
@pytest.fixture(scope="module")
def llm(tok):
    return LLM(build_tiny_llama()._replace(tokenizer=tok), block_size=8, num_kv_blocks=64)


def test_llm_renders_as_the_server(llm, http, tok):
    for messages, fields in [
            (CHAT, {}), (CHAT, {"chat_template_kwargs": {"enable_thinking": False}}),
            (CHAT, {"add_generation_prompt": False}),
            (CHAT, {"chat_template": OTHER, "chat_template_kwargs": {"greeting": "!"}}),
            (PARTIAL, {"continue_final_message": True, "add_generation_prompt": False})]:
        assert llm.apply_chat_template(messages, **fields) == _rendered(http, tok, messages,
                                                                        **fields)
        assert llm.apply_chat_template(messages, tokenize=True, **fields) == http.post(
            "/tokenize", json={"messages": messages, **fields}).json()["tokens"]


def test_llm_chat_continues_the_final_message(llm, tok):
    params = SamplingParams(temperature=0, max_tokens=3)
    out = llm.chat(PARTIAL, params, use_tqdm=False, add_generation_prompt=False,
                   continue_final_message=True)[0]
    # the prompt ends inside the assistant's message (no end token), and the generation
    # goes on from there: as generating from the open text
    assert out.prompt_token_ids == tok.encode(PARTIAL_TEXT)
    assert tok.convert_tokens_to_ids("<|im_end|>") not in out.prompt_token_ids[-9:]
    plain = llm.generate([{"prompt_token_ids": tok.encode(PARTIAL_TEXT)}], params,
                         use_tqdm=False)[0]
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    kwargs = llm.chat(CHAT, params, use_tqdm=False,
                      chat_template_kwargs={"enable_thinking": False})[0]
    assert kwargs.prompt_token_ids == tok.encode(CHAT_TEXT + "<think>\n\n</think>\n\n")


@pytest.mark.parametrize("fields, match", [
    ({"continue_final_message": True},
     r"^continue_final_message=true needs add_generation_prompt=false"),
    ({"chat_template_kwargs": {"tokenize": True}},
     r"^chat_template_kwargs key 'tokenize' is not allowed"),
    ({"chat_template_kwargs": [("a", 1)]}, (r"^chat_template_kwargs=\[\('a', 1\)\] must be an "
                                            "object")),
    ({"chat_template_kwargs": {1: 2}}, r"^chat_template_kwargs key 1 must be a string"),
    ({"chat_template": "{% if %}"}, r"^chat_template does not parse: "),
    ({"continue_final_message": 1, "add_generation_prompt": False},
     r"^continue_final_message=1 must be true or false"),
])
def test_llm_refuses_what_the_server_refuses(llm, fields, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(PARTIAL, SamplingParams(max_tokens=1), use_tqdm=False, **fields)
    with pytest.raises(ValueError, match=r"^messages\[0\]: " + match[1:]):
        llm.chat([PARTIAL, PARTIAL], SamplingParams(max_tokens=1), use_tqdm=False, **fields)


@pytest.mark.parametrize("path", ["/tokenize", "/v1/chat/completions"])
def test_a_request_template_needs_a_trusting_server(tok, path):
    """Without --trust-request-chat-template a request's chat_template is a 400 naming it
    (client-supplied Jinja is not run), as in vLLM; the model's own template still serves."""
    http = TestClient(build_app(_Client(tok.encode(CONTINUATION)), tok, "m"),
                      base_url="http://127.0.0.1")
    r = http.post(path, json={"messages": CHAT, "chat_template": OTHER, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "chat_template"
    assert "--trust-request-chat-template" in r.json()["error"]["message"]
    assert http.post(path, json={"messages": CHAT, "max_tokens": 2}).status_code == 200


# a template that writes every message but the last: under continue_final_message there is no
# final message left to continue
DROPS_LAST = "{% for m in messages[:-1] %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
DROPPED = ("continue_final_message=true: continue_final_message is set but the final message "
           "does not appear in the chat after applying the chat template")
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


@pytest.mark.parametrize("path", ["/tokenize", "/v1/chat/completions"])
def test_a_template_that_drops_the_final_message_is_a_400(http, path):
    r = http.post(path, json={"messages": PARTIAL, "chat_template": DROPS_LAST,
                              "max_tokens": 2, **CONTINUE})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["type"], error["code"]) == (
        "continue_final_message", "invalid_request_error", None)
    assert error["message"].startswith(DROPPED), error["message"]
    # the same template without continue_final_message renders (the last message is left out)
    r = http.post(path, json={"messages": PARTIAL, "chat_template": DROPS_LAST,
                              "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_llm_refuses_a_template_that_drops_the_final_message(llm):
    from pagedrt.entrypoints.chat_template import ChatTemplateError

    with pytest.raises(ChatTemplateError, match="^" + DROPPED) as caught:
        llm.chat(PARTIAL, SamplingParams(max_tokens=1), use_tqdm=False,
                 chat_template=DROPS_LAST, **CONTINUE)
    assert caught.value.param == "continue_final_message"
    assert llm.apply_chat_template(PARTIAL, chat_template=DROPS_LAST,
                                   add_generation_prompt=False) == "user: Count to three.\n"


def test_the_early_length_check_counts_contents_not_reasoning_or_documents(http, tok):
    """Before rendering only the contents count against max_model_len x the longest token's
    characters: an assistant's reasoning and documents that the template leaves out do not
    refuse a chat that fits, and where the template renders them the rendered text is held
    to the same bound."""
    max_chars = 2048 * max(len(token) for token in tok.get_vocab())
    long = "x" * (max_chars + 1)
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello", "reasoning_content": long},
               {"role": "user", "content": "Bye"}]
    documents = [{"title": "t", "text": long}]
    for path in ["/tokenize", "/v1/chat/completions"]:
        # TEMPLATE renders neither: the chat is short and passes
        for extra in [{"messages": history}, {"messages": CHAT, "documents": documents}]:
            r = http.post(path, json={"max_tokens": 1, **extra})
            assert r.status_code == 200, r.text
        # a content that long is refused before rendering, naming its characters
        r = http.post(path, json={"messages": [{"role": "user", "content": long}]})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")
        assert error["message"].startswith(f"messages has {max_chars + 1} characters, more "
                                           "than max_model_len=2048 tokens can hold")
        # a template that renders the reasoning: the rendered text is refused
        renders = "{% for m in messages %}{{ m.content }}{{ m.reasoning_content }}{% endfor %}"
        r = http.post(path, json={"messages": history, "chat_template": renders})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")
        assert error["message"].startswith(f"messages has {max_chars + 1 + len('HiHelloBye')} "
                                           "characters")
