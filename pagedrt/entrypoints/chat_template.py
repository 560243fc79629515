"""One rule for rendering a chat through a chat template, shared by the server's chat endpoint
and /tokenize (openai_server) and by `LLM.chat` / `LLM.apply_chat_template`, with vLLM's
request fields and transformers' `apply_chat_template` doing the rendering:

- `chat_template`: a Jinja template string rendered in place of the model's (transformers
  compiles it in its sandboxed Jinja environment). One that does not parse, or fails while
  rendering, is an error naming `chat_template`.
- `chat_template_kwargs`: extra variables for the template (Qwen3's
  {"enable_thinking": false}), passed as `apply_chat_template`'s **kwargs. A dict with string
  keys; a key that would clash with what transformers passes on its own is refused rather
  than let through: an argument of `apply_chat_template` itself (tokenize, conversation,
  chat_template, add_generation_prompt, continue_final_message, tools, documents, padding,
  return_dict, tokenizer_kwargs, ...: read from the tokenizer's signature, plus a fixed list),
  a variable transformers sets for the template (messages, raise_exception, strftime_now) or a
  special token's name (bos_token, eos_token, ...: transformers would let the kwarg replace
  the tokenizer's token).
- `documents`: vLLM's field for RAG templates (Command-R's, Granite's), passed as
  `apply_chat_template(documents=...)`: a list of objects with string keys, typically
  {"title", "text"} (`check_documents`); the template decides how (and whether) to render
  them. Left out, nothing is passed, and the chat renders as without the field.
- `add_generation_prompt` (default true): end with the assistant's header so that the model
  writes a new assistant message.
- `continue_final_message` (default false): render the last message open-ended (without the
  end the template writes after it), so that the model continues it. As in vLLM it needs
  add_generation_prompt false; here the last message must also be the assistant's.

Errors are `ChatTemplateError`, a ValueError naming the request field at fault (`param`).
"""

from __future__ import annotations

import inspect

from pagedrt.sampling_params import short_repr

# variables transformers' render_jinja_template passes or defines itself, and arguments of
# apply_chat_template (any transformers version) that are not in every signature
_RESERVED = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "sanitize_control_tokens", "raise_exception", "strftime_now",
    "special_tokens_map", "additional_special_tokens"})


class ChatTemplateError(ValueError):
    """A chat that cannot be rendered as asked; `param` is the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def reserved_template_kwargs(tok) -> frozenset[str]:
    """The keys `chat_template_kwargs` may not have for tokenizer `tok` (module docstring)."""
    names = set(_RESERVED)
    try:
        params = inspect.signature(tok.apply_chat_template).parameters.values()
        names.update(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    except (TypeError, ValueError):  # (no signature to read: the fixed list)
        pass
    names.update(getattr(tok, "SPECIAL_TOKENS_ATTRIBUTES", ()))
    names.update(getattr(tok, "special_tokens_map", None) or {})
    return frozenset(names)


def check_template_kwargs(tok, kwargs) -> dict:
    """`kwargs` (chat_template_kwargs; None is none) as apply_chat_template's **kwargs, or
    ChatTemplateError naming chat_template_kwargs."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ChatTemplateError(f"chat_template_kwargs={short_repr(kwargs)} must be an object "
                                "of the template's variables", "chat_template_kwargs")
    reserved = reserved_template_kwargs(tok)
    for key in kwargs:
        if not isinstance(key, str):
            raise ChatTemplateError(f"chat_template_kwargs key {short_repr(key)} must be a "
                                    "string", "chat_template_kwargs")
        if key in reserved:
            raise ChatTemplateError(
                f"chat_template_kwargs key {key!r} is not allowed: it names an argument of "
                "apply_chat_template or a variable transformers sets for the template (the "
                "request's own fields chat_template, add_generation_prompt and "
                "continue_final_message set those)", "chat_template_kwargs")
    return dict(kwargs)


def check_documents(documents) -> list[dict] | None:
    """`documents` (None is none) as apply_chat_template takes them: a list of objects
    (dicts) with string keys, copied; or ChatTemplateError naming documents."""
    if documents is None:
        return None
    if not isinstance(documents, list):
        raise ChatTemplateError(f"documents={short_repr(documents)} must be a list of objects "
                                "(e.g. {'title': ..., 'text': ...})", "documents")
    for i, document in enumerate(documents):
        if not isinstance(document, dict):
            raise ChatTemplateError(f"documents[{i}]={short_repr(document)} must be an object "
                                    "(e.g. {'title': ..., 'text': ...})", "documents")
        for key in document:
            if not isinstance(key, str):
                raise ChatTemplateError(f"documents[{i}] key {short_repr(key)} must be a "
                                        "string", "documents")
    return [dict(document) for document in documents]


def render_chat(tok, conversation: list[dict], *, add_generation_prompt: bool = True,
                continue_final_message: bool = False, chat_template: str | None = None,
                chat_template_kwargs: dict | None = None,
                documents: list[dict] | None = None) -> str:
    """The text of `conversation` (the template's message dicts, at least one) through
    `chat_template` or else the tokenizer's own template (the caller checks that there is
    one). ChatTemplateError naming the field at fault: chat_template (not a non-empty
    string, does not parse or fails to render), chat_template_kwargs
    (`check_template_kwargs`), documents (`check_documents`), continue_final_message (with
    add_generation_prompt, or the last message not the assistant's, or a template that drops
    it) or, for the model's own template failing, messages."""
    if chat_template is not None and (not isinstance(chat_template, str)
                                      or not chat_template.strip()):
        raise ChatTemplateError(f"chat_template={short_repr(chat_template)} must be a Jinja "
                                "template string (not blank)", "chat_template")
    for name, value in (("add_generation_prompt", add_generation_prompt),
                        ("continue_final_message", continue_final_message)):
        if not isinstance(value, bool):
            raise ChatTemplateError(f"{name}={short_repr(value)} must be true or false", name)
    kwargs = check_template_kwargs(tok, chat_template_kwargs)
    documents = check_documents(documents)
    if documents is not None:  # (left out otherwise: a plain chat's call as before)
        kwargs["documents"] = documents
    if continue_final_message:
        if add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message=true needs add_generation_prompt=false (it continues "
                "the last message instead of starting a new one)", "continue_final_message")
        role = conversation[-1].get("role") if conversation else None
        if role != "assistant":
            raise ChatTemplateError(
                "continue_final_message=true continues the last message, which must be the "
                f"assistant's; it is {role!r}", "continue_final_message")
    from jinja2 import TemplateSyntaxError

    try:
        return tok.apply_chat_template(
            conversation, tokenize=False, chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **kwargs)
    except TemplateSyntaxError as e:
        if chat_template is None:
            raise ChatTemplateError(f"chat template failed: {e}", "messages") from None
        raise ChatTemplateError(f"chat_template does not parse: {e}", "chat_template") from None
    except Exception as e:  # noqa: BLE001 - a template may refuse a role order or name
        if continue_final_message and isinstance(e, ValueError) and \
                "continue_final_message" in str(e):
            why = str(e).split("Final message to continue")[0].strip()  # (not the whole chat)
            raise ChatTemplateError(f"continue_final_message=true: {why}",
                                    "continue_final_message") from None
        if chat_template is None:
            raise ChatTemplateError(f"chat template failed: {e}", "messages") from None
        raise ChatTemplateError(f"chat_template does not render: {e}",
                                "chat_template") from None
