"""A chat template writes its own special tokens (Llama 3's and Gemma's start with the BOS
token): the chat paths must not let the tokenizer add a second BOS when they encode the
rendered text, as transformers' `apply_chat_template(tokenize=True)` and vLLM's chat do not.
Plain prompts keep the tokenizer's default (one BOS added). The tokenizer here adds BOS to a
plain prompt, as Llama's and Gemma's do; SmolLM2's adds nothing, so it cannot show the bug."""

from __future__ import annotations

import asyncio

import pytest
from test_stream_handler import _InstantClient
from tiny_model import build_tiny_llama

from pagedrt import LLM, SamplingParams
from pagedrt.entrypoints.openai_server import OpenAIServer
from pagedrt.entrypoints.protocol import ChatMessage, TokenizeRequest

BOS = 1
CONVERSATION = [{"role": "user", "content": "name a planet"}]


@pytest.fixture(scope="module")
def bos_tokenizer():
    """A word-level tokenizer that adds BOS to every plain prompt, with a template that
    starts with the BOS token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "user", "assistant", ":", "hi", "there", "name", "a",
             "planet"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                           special_tokens=[("<s>", BOS)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    tok.chat_template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} : "
                         "{{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}assistant :{% endif %}")
    assert tok.encode("hi there") == [BOS, 6, 7]  # (a plain prompt gets its BOS)
    return tok


def _hf_chat_ids(tok, conversation) -> list[int]:
    ids = tok.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def llm(bos_tokenizer):
    return LLM(build_tiny_llama()._replace(tokenizer=bos_tokenizer), block_size=8,
               num_kv_blocks=64)


def test_chat_prompts_hold_one_bos(llm, bos_tokenizer):
    expected = _hf_chat_ids(bos_tokenizer, CONVERSATION)
    assert expected.count(BOS) == 1
    assert llm.apply_chat_template(CONVERSATION, tokenize=True) == expected
    prompt = llm.chat_prompt(CONVERSATION)
    assert prompt == {"prompt": llm.apply_chat_template(CONVERSATION),
                      "prompt_token_ids": expected}
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    out = llm.chat(CONVERSATION, params, use_tqdm=False)[0]
    assert out.prompt_token_ids == expected
    assert out.prompt == prompt["prompt"]
    # the batch form too
    outs = llm.chat([CONVERSATION, CONVERSATION], params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [expected, expected]
    # a plain text prompt keeps the tokenizer's own BOS
    plain = llm.generate(["hi there"], params, use_tqdm=False)[0]
    assert plain.prompt_token_ids == [BOS, 6, 7]


def test_server_chat_prompts_hold_one_bos_unless_asked(bos_tokenizer):
    server = OpenAIServer(_InstantClient([]), bos_tokenizer, "m", None)
    messages = [ChatMessage(role="user", content="name a planet")]
    expected = _hf_chat_ids(bos_tokenizer, CONVERSATION)
    assert asyncio.run(server._chat_prompt(TokenizeRequest(messages=messages))) == expected
    # vLLM's add_special_tokens=true asks for the tokenizer's own on top
    assert asyncio.run(server._chat_prompt(TokenizeRequest(
        messages=messages, add_special_tokens=True))) == [BOS] + expected
    # completions' prompt texts keep the tokenizer's default
    assert asyncio.run(server.prompt_input.encode(["hi there"], "prompt")) == [[BOS, 6, 7]]
