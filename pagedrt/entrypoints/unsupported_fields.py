"""Request fields of OpenAI's API and vLLM's extensions that pagedrt does not build and that
would change the output or its format: a request that sets one to anything but a value that
changes nothing gets a 400 naming the field, instead of an answer that silently ignores it.

Checked on the raw body, before the fields pagedrt serves are validated
(`unsupported_field`, called by `protocol._SamplingRequest`), for /v1/completions and
/v1/chat/completions alike (a field only one of OpenAI's endpoints defines is no more
meaningful at the other). A field sent as null is not set.

Accepted and ignored, since they change neither the tokens nor the response's shape: `user`,
`metadata`, `store`, `service_tier`, `parallel_tool_calls` (tools are refused),
`prediction` (a latency hint: the output does not depend on it), `prompt_cache_key`,
`safety_identifier`, and vLLM's `priority`, `request_id`, `cache_salt`,
`kv_transfer_params`, `vllm_xargs`, `include_reasoning`. Any other unknown field is ignored
too, so that clients sending fields newer than this table keep working.

vLLM's chat template fields (chat_template, chat_template_kwargs, continue_final_message,
add_generation_prompt, documents) are served by /v1/chat/completions and /tokenize
(pagedrt/entrypoints/chat_template.py); /v1/completions, which renders no template, ignores
them as vLLM does.

vLLM's `return_token_ids` is served, so not in this table: the prompt's and the choices' token
ids in the response (pagedrt/entrypoints/response.py). So is `stream_options` with both its
keys, OpenAI's `include_usage` and vLLM's `continuous_usage_stats` (each streamed chunk's
choice's usage so far; only together with include_usage, as in vLLM).
"""

from __future__ import annotations

from collections.abc import Callable

from pagedrt.sampling_params import short_repr


def _equals(*harmless) -> Callable[[object, dict], bool]:
    return lambda value, body: any(value == h and type(value) is type(h) for h in harmless)


def _never(value, body) -> bool:
    return False


def _text_format(value, body) -> bool:
    return value == {"type": "text"}


def _best_of_is_n(value, body) -> bool:
    n = body.get("n")
    return type(value) is int and value == (1 if n is None else n)


# field -> (whether a value changes nothing, what the server does instead)
_REFUSED: dict[str, tuple[Callable[[object, dict], bool], str]] = {
    # OpenAI's chat completions
    "response_format": (_text_format, 'only {"type": "text"}: no JSON mode or JSON schema'),
    "tools": (_equals([]), "no tool calling"),
    "tool_choice": (_equals("none"), 'no tool calling ("none" only)'),
    "functions": (_equals([]), "no function calling"),
    "function_call": (_equals("none"), 'no function calling ("none" only)'),
    "audio": (_never, "text output only"),
    "modalities": (_equals(["text"]), 'text output only (["text"])'),
    "reasoning_effort": (_never, "no reasoning controls"),
    "verbosity": (_never, "no verbosity control"),
    "web_search_options": (_never, "no web search"),
    # OpenAI's completions
    "best_of": (_best_of_is_n, "no best-of ranking (best_of equal to n only)"),
    # vLLM's extensions
    "guided_json": (_never, "no guided decoding"),
    "guided_regex": (_never, "no guided decoding"),
    "guided_choice": (_never, "no guided decoding"),
    "guided_grammar": (_never, "no guided decoding"),
    "guided_decoding_backend": (_never, "no guided decoding"),
    "guided_whitespace_pattern": (_never, "no guided decoding"),
    "structured_outputs": (_never, "no guided decoding"),
    "logits_processors": (_equals([]), "no custom logits processors"),
    "spaces_between_special_tokens": (_equals(True), "true only"),
    "mm_processor_kwargs": (_equals({}), "text models only"),
}


def unsupported_field(body: object) -> tuple[str, str] | None:
    """(field, message) for the first field of `body` (a request body as parsed from JSON)
    that `_REFUSED` names with a value that would change the output; None when there is none
    (or `body` is not a dict: its validation says what is wrong)."""
    if not isinstance(body, dict):
        return None
    for name, (harmless, instead) in _REFUSED.items():
        value = body.get(name)
        if value is not None and not harmless(value, body):
            return name, f"{name}={short_repr(value)} is not supported by this server ({instead})"
    return None
