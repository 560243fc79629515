"""An assistant message's reasoning and the request's `documents` reach the chat template, as in
vLLM: `reasoning` (vLLM's name) or `reasoning_content` (its older one) on an assistant's
message is passed under both keys (Qwen3 / DeepSeek-R1 templates read `reasoning_content`),
and `documents` (a list of objects, e.g. {"title", "text"}) as apply_chat_template's
`documents` (RAG templates). Until then reasoning was dropped and documents refused.

Through the server's app in this process (tests/test_chat_message_fields.py's engine client
and byte-level tokenizer, whose template here prints both), /tokenize giving the rendered
text; then LLM.chat / LLM.apply_chat_template."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from test_chat_message_fields import _Client
from tiny_model import build_tiny_llama, byte_level_chat_tokenizer

from pagedrt import LLM, SamplingParams
from pagedrt.entrypoints.openai_server import build_app

TEMPLATE = (
    "{% if documents %}{{ '<|im_start|>docs\\n' }}{% for d in documents %}"
    "[{{ d.title }}] {{ d.text }}{{ '\\n' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>"
    "{% endif %}"
    "{% if m.reasoning is defined %}(r={{ m.reasoning }}){% endif %}"
    "{{ m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

PLAIN = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
         {"role": "user", "content": "2+2?"}]
PLAIN_TEXT = ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
              "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
THOUGHT_TEXT = PLAIN_TEXT.replace("assistant\nHello.",
                                  "assistant\n<think>Greet back.</think>(r=Greet back.)Hello.")
DOCS = [{"title": "Paris", "text": "Capital of France."},
        {"title": "Lyon", "text": "On the Rhone."}]
DOCS_TEXT = ("<|im_start|>docs\n[Paris] Capital of France.\n[Lyon] On the Rhone.\n"
             "<|im_end|>\n") + PLAIN_TEXT


def _with_reasoning(key: str, text: str = "Greet back.") -> list:
    return [PLAIN[0], {**PLAIN[1], key: text}, PLAIN[2]]


@pytest.fixture(scope="module")
def tok():
    return byte_level_chat_tokenizer(TEMPLATE)


@pytest.fixture(scope="module")
def http(tok):
    return TestClient(build_app(_Client(tok.encode(" 4")), tok, "m"),
                      base_url="http://127.0.0.1")


def _rendered(http, tok, messages: list, **extra) -> str:
    r = http.post("/tokenize", json={"messages": messages, **extra})
    assert r.status_code == 200, r.text
    return tok.decode(r.json()["tokens"])


def test_a_plain_chat_renders_as_before(http, tok):
    assert _rendered(http, tok, PLAIN) == PLAIN_TEXT
    assert tok.apply_chat_template(PLAIN, tokenize=False, add_generation_prompt=True) == (
        PLAIN_TEXT)


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content"])
def test_an_assistants_reasoning_reaches_the_template(http, tok, key):
    assert _rendered(http, tok, _with_reasoning(key)) == THOUGHT_TEXT
    # the chat endpoint renders the same prompt
    r = http.post("/v1/chat/completions", json={"messages": _with_reasoning(key),
                                                 "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(THOUGHT_TEXT))


def test_both_names_with_one_text_and_null_and_empty_reasoning(http, tok):
    both = _with_reasoning("reasoning")
    both[1]["reasoning_content"] = "Greet back."
    assert _rendered(http, tok, both) == THOUGHT_TEXT
    assert _rendered(http, tok, _with_reasoning("reasoning", None)) == PLAIN_TEXT
    assert _rendered(http, tok, _with_reasoning("reasoning_content", "")) == (
        PLAIN_TEXT.replace("assistant\nHello.", "assistant\n<think></think>(r=)Hello."))


def test_documents_reach_the_template(http, tok):
    assert _rendered(http, tok, PLAIN, documents=DOCS) == DOCS_TEXT
    r = http.post("/v1/chat/completions", json={"messages": PLAIN, "documents": DOCS,
                                                 "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(DOCS_TEXT))
    # an empty list: nothing to render (the template's `if documents`)
    assert _rendered(http, tok, PLAIN, documents=[]) == PLAIN_TEXT


@pytest.mark.parametrize(("message", "starts"), [
    ({"role": "user", "content": "x", "reasoning": "hm"},
     ("messages.0.reasoning='hm': reasoning goes only in an assistant's message; this "
     "message's role is 'user'")),
    ({"role": "system", "content": "x", "reasoning_content": "hm"},
     ("messages.0.reasoning_content='hm': reasoning_content goes only in an assistant's "
     "message; this message's role is 'system'")),
    ({"role": "assistant", "content": "x", "reasoning": 5},
     "messages.0.reasoning=5: Input should be a valid string"),
    ({"role": "assistant", "content": "x", "reasoning_content": ["a"]},
     "messages.0.reasoning_content=['a']: Input should be a valid string"),
    ({"role": "assistant", "content": "x", "reasoning": "a", "reasoning_content": "b"},
     "messages.0.reasoning_content='b': reasoning_content differs from reasoning"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_bad_reasoning_is_a_400_naming_the_field(http, path, message, starts):
    r = http.post(path, json={"messages": [message]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error", error
    assert error["message"].startswith(starts), error["message"]


@pytest.mark.parametrize(("documents", "starts"), [
    ({"title": "a", "text": "b"}, ("documents={'title': 'a', 'text': 'b'}: Input should be a "
                                  "valid array")),
    ("Paris is the capital", "documents='Paris is the capital': Input should be a valid array"),
    (["Paris"], "documents.0='Paris': Input should be an object"),
    ([DOCS[0], 5], "documents.1=5: Input should be an object"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_documents_of_a_wrong_shape_are_a_400_naming_documents(http, path, documents, starts):
    r = http.post(path, json={"messages": PLAIN, "documents": documents})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["type"]) == ("documents", "invalid_request_error"), error
    assert error["message"].startswith(starts), error["message"]


def test_tokenize_takes_documents_only_with_messages(http):
    r = http.post("/tokenize", json={"prompt": "hi", "documents": DOCS})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "documents"
    assert r.json()["error"]["message"] == "documents goes with messages, not prompt"


def test_completions_ignore_documents(http):
    """/v1/completions renders no template: it ignores documents, as vLLM's does."""
    r = http.post("/v1/completions", json={"prompt": "hi", "documents": DOCS, "max_tokens": 2})
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------ LLM.chat
@pytest.fixture(scope="module")
def llm(tok):
    return LLM(build_tiny_llama()._replace(tokenizer=tok), block_size=8, num_kv_blocks=64)


def test_llm_renders_reasoning_and_documents_as_the_server(llm, http, tok):
    assert llm.apply_chat_template(PLAIN) == PLAIN_TEXT
    for key in ("reasoning", "reasoning_content"):
        assert llm.apply_chat_template(_with_reasoning(key)) == THOUGHT_TEXT
    assert llm.apply_chat_template(PLAIN, documents=DOCS) == DOCS_TEXT
    assert llm.apply_chat_template(PLAIN, documents=DOCS, tokenize=True) == (
        http.post("/tokenize", json={"messages": PLAIN, "documents": DOCS}).json()["tokens"])
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    out = llm.chat(_with_reasoning("reasoning_content"), params, use_tqdm=False,
                   documents=DOCS)[0]
    expected = DOCS_TEXT.replace(PLAIN_TEXT, THOUGHT_TEXT)
    assert out.prompt == expected
    assert out.prompt_token_ids == tok.encode(expected, add_special_tokens=False)
    # documents go with every conversation of a batch
    outs = llm.chat([PLAIN, PLAIN], params, use_tqdm=False, documents=DOCS)
    assert [o.prompt for o in outs] == [DOCS_TEXT, DOCS_TEXT]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"messages": [{"role": "user", "content": "x", "reasoning": "hm"}]},
     r"^chat message .*reasoning='hm': reasoning goes only in an assistant's message"),
    ({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 1}]},
     r"^chat message .*reasoning_content=1: Input should be a valid string"),
    ({"documents": {"title": "a"}}, r"^documents=\{'title': 'a'\} must be a list of objects"),
    ({"documents": ["a"]}, r"^documents\[0\]='a' must be an object"),
    ({"documents": [{1: "a"}]}, r"^documents\[0\] key 1 must be a string"),
])
def test_llm_refuses_what_the_server_refuses(llm, kwargs, match):
    messages = kwargs.pop("messages", PLAIN)
    with pytest.raises(ValueError, match=match) as e:
        llm.apply_chat_template(messages, **kwargs)
    if "documents" in kwargs:
        assert e.value.param == "documents"
