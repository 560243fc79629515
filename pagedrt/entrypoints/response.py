"""OpenAI response bodies from `RequestOutput`s: whole responses and stream chunks.

Choice indices: with a batch of prompts, choice `prompt_index * n + sample_index` (OpenAI's
order). Logprobs come per generated token; tokens are shown as their own decoded text.
Completions' `top_logprobs` (a {token text: logprob} per position) hold the `logprobs` most
likely tokens and also the position's own token (sampled, or the prompt's with echo) when it is
not among them, as OpenAI's legacy completions do (so `logprobs=0` gives that token alone);
chat's `top_logprobs` lists hold exactly the asked number.

Echo (completions, `echo=true`): each choice's text starts with its prompt's text (streamed:
the first chunk of each choice), and with logprobs its logprobs object covers the prompt tokens
first (the first with a null token_logprob and top_logprobs, nothing coming before it), their
text offsets counting from 0 and the generated tokens' continuing after them.

Prompt logprobs (vLLM's `prompt_logprobs` field): a list with one entry per prompt token, null
for the first, then {token id as a string: {"logprob", "rank", "decoded_token"}} holding the
prompt token and the asked number of most likely tokens at its position; on each completion
choice (and at the top of a completion response with one prompt), at the top of a chat
response.

Token ids as tokens (vLLM's `return_tokens_as_token_ids`): every token of the logprobs (the
chosen and the top_logprobs ones, echoed prompt tokens too) is named "token_id:{id}" instead
of its text, so that a client gets the id of a token whose text is not valid UTF-8 on its own;
chat's `bytes` are then that string's UTF-8 bytes (as in vLLM). text_offset still counts the
tokens' text (vLLM counts the "token_id:..." strings, which are not in the text). Prompt
logprobs' `decoded_token` stays the text (vLLM's).

Token ids (vLLM's `return_token_ids`): the prompt that ran (after truncate_prompt_tokens; with
echo still the prompt alone) as `prompt_token_ids`, on each completion choice and at the top of
a chat response, and each choice's generated ids as its `token_ids`: exactly
`CompletionOutput.token_ids`, the ids the engine produced, the one that ended the choice
included (an EOS or stop token id; for a stop string, the token that completed it, although
the text stops before the stop string; echo adds none; echo-only scoring has none). Streamed:
each chunk of a choice carries the ids new since that choice's previous chunk as `token_ids`
(ids whose text is still held back, a possible stop string or a partial UTF-8 character, go
with the chunk that sends it, or with the last one), so that a choice's chunks' ids together
are its non-streamed `token_ids`; a completion choice's first chunk also carries
`prompt_token_ids`, and on chat every opening (role) chunk carries it at the top. Without the
field the responses have neither key.

Continuous usage (vLLM's `stream_options.continuous_usage_stats`, with `include_usage`): every
streamed chunk that has a choice (chat's opening role chunks too) also carries `usage`, the
counts so far of that chunk's choice, as vLLM counts them: prompt_tokens of its prompt,
completion_tokens the tokens it has generated so far (held-back text included), never
decreasing and, on its last chunk, its whole count; so with one prompt and n = 1 the last
chunk's count is the final usage chunk's, and otherwise the choices' last counts sum to it.
Those chunks all go through `update_one` (`text_sse` has no usage). Without it no chunk but the
final usage-only one (include_usage) has `usage`.
"""

from __future__ import annotations

import copy
import json
import time

from pagedrt.engine.sampler import TokenLogprobs
from pagedrt.outputs import CompletionOutput, RequestOutput

# JSON has no -Infinity; a token the model rules out gets this instead (as vLLM does).
_MIN_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return max(_MIN_LOGPROB, logprob)


class ResponseBuilder:
    """Stateless formatting, plus a cache of single-token texts (for logprobs)."""

    def __init__(self, tokenizer, model_name: str) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self._token_texts: dict[int, str] = {}
        self.as_token_ids = False

    def for_request(self, return_tokens_as_token_ids: bool | None) -> ResponseBuilder:
        """This builder, or one sharing its text cache that names the logprobs' tokens
        "token_id:{id}" (`token_label`)."""
        if not return_tokens_as_token_ids:
            return self
        builder = copy.copy(self)  # (shallow: the cache dict is shared)
        builder.as_token_ids = True
        return builder

    def token_label(self, token_id: int) -> str:
        """How logprobs name a token: its text, or "token_id:{id}" (as_token_ids)."""
        return f"token_id:{token_id}" if self.as_token_ids else self.token_text(token_id)

    def token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = (self.tokenizer.decode([token_id]) if self.tokenizer is not None
                    else f"token_id:{token_id}")
            self._token_texts[token_id] = text
        return text

    # ------------------------------------------------------------ logprobs
    def top_with_chosen(self, e: TokenLogprobs, num_top: int | None = None) -> dict:
        """A legacy completions `top_logprobs` entry: {token text: logprob} of the num_top
        (None: all of e.top_logprobs) most likely tokens, most likely first, then the chosen
        token (sampled, or the prompt's) where it is not among them: num_top + 1 entries at
        most, as OpenAI's legacy completions give. Tokens whose texts are the same share one
        key, holding the likelier one's logprob."""
        pairs = e.top_logprobs if num_top is None else e.top_logprobs[:num_top]
        top: dict[str, float] = {}
        for t, lp in pairs:
            top.setdefault(self.token_label(t), _finite(lp))
        if all(t != e.token_id for t, _ in pairs):
            top.setdefault(self.token_label(e.token_id), _finite(e.logprob))
        return top

    def completion_logprobs(self, entries: list[TokenLogprobs], text_offset: int) -> dict:
        """Legacy completions shape: parallel lists, top_logprobs as {token text: logprob}
        (the k most likely and the sampled token: `top_with_chosen`)."""
        tokens, token_logprobs, top, offsets = [], [], [], []
        for e in entries:
            tokens.append(self.token_label(e.token_id))
            token_logprobs.append(_finite(e.logprob))
            top.append(self.top_with_chosen(e))
            offsets.append(text_offset)
            text_offset += len(self.token_text(e.token_id))
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
                "text_offset": offsets}

    def chat_logprobs(self, entries: list[TokenLogprobs]) -> dict:
        def item(token_id: int, logprob: float) -> dict:
            text = self.token_label(token_id)
            return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

        content = []
        for e in entries:
            entry = item(e.token_id, e.logprob)
            entry["top_logprobs"] = [item(t, lp) for t, lp in e.top_logprobs]
            content.append(entry)
        return {"content": content}

    def echo_logprobs(self, token_ids: list[int], entries: list | None,
                      num_top: int) -> tuple[dict, int]:
        """The legacy completions logprobs of echoed prompt tokens, and the text offset after
        them.

        Args:
            token_ids: the prompt.
            entries: RequestOutput.prompt_logprobs (None first, then a TokenLogprobs per
                token); None or missing entries give null values.
            num_top: the most likely tokens per position (the request's logprobs); the
                prompt token is added where it is not among them (`top_with_chosen`).
        """
        tokens, token_logprobs, top, offsets = [], [], [], []
        offset = 0
        for j, token_id in enumerate(token_ids):
            text = self.token_text(token_id)
            e = entries[j] if entries is not None and j < len(entries) else None
            tokens.append(self.token_label(token_id))
            token_logprobs.append(None if e is None else _finite(e.logprob))
            top.append(None if e is None else self.top_with_chosen(e, num_top))
            offsets.append(offset)
            offset += len(text)
        return ({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
                 "text_offset": offsets}, offset)

    def prompt_logprobs(self, entries: list | None, num_top: int) -> list | None:
        """vLLM's `prompt_logprobs` response field from RequestOutput.prompt_logprobs: None
        first, then per prompt token {str(token id): {"logprob", "rank", "decoded_token"}},
        the token itself and its num_top most likely (rank: their order, 1 first)."""
        if entries is None:
            return None
        out: list = []
        for e in entries:
            if e is None:
                out.append(None)
                continue
            item = {str(e.token_id): {"logprob": _finite(e.logprob), "rank": e.rank,
                                      "decoded_token": self.token_text(e.token_id)}}
            for rank, (t, lp) in enumerate(e.top_logprobs[:num_top], start=1):
                item.setdefault(str(t), {"logprob": _finite(lp), "rank": rank,
                                         "decoded_token": self.token_text(t)})
            out.append(item)
        return out

    def _logprobs(self, kind: str, entries: list[TokenLogprobs] | None, text_offset: int = 0):
        if entries is None:
            return None
        if kind == "chat":
            return self.chat_logprobs(entries)
        return self.completion_logprobs(entries, text_offset)

    # ------------------------------------------------------------ whole responses
    def full_response(self, kind: str, response_id: str, finals: list[RequestOutput],
                      n: int, echo: bool = False, num_top: int = 0,
                      prompt_logprobs: int | None = None, token_ids: bool = False) -> dict:
        """The whole response. echo (completions): each RequestOutput's `prompt` (the prompt's
        text) leads its choices' text, and its prompt logprobs their logprobs (num_top: the
        request's logprobs). prompt_logprobs: the top count of vLLM's field when asked (from
        each RequestOutput.prompt_logprobs), else None (no field). token_ids (vLLM's
        return_token_ids): `prompt_token_ids` and `token_ids` as the module docstring says."""
        choices = []
        for p, out in enumerate(finals):
            for o in out.outputs:
                logprobs = self._logprobs(kind, o.logprobs)
                text = o.text
                if echo and kind != "chat":
                    text = (out.prompt or "") + text
                    if logprobs is not None:
                        head, end = self.echo_logprobs(out.prompt_token_ids,
                                                       out.prompt_logprobs, num_top)
                        logprobs = _joined(head, self.completion_logprobs(o.logprobs, end))
                choice = {"index": p * n + o.index, "logprobs": logprobs,
                          "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}
                if kind == "chat":
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                    if prompt_logprobs is not None:
                        choice["prompt_logprobs"] = self.prompt_logprobs(out.prompt_logprobs,
                                                                         prompt_logprobs)
                    if token_ids:
                        choice["prompt_token_ids"] = list(out.prompt_token_ids)
                if token_ids:
                    choice["token_ids"] = list(o.token_ids)
                choices.append(choice)
        choices.sort(key=lambda c: c["index"])
        response = {"id": response_id, "object": "chat.completion" if kind == "chat"
                    else "text_completion", "created": int(time.time()),
                    "model": self.model_name, "choices": choices, "usage": usage(finals)}
        if prompt_logprobs is not None and len(finals) == 1:
            response["prompt_logprobs"] = self.prompt_logprobs(finals[0].prompt_logprobs,
                                                               prompt_logprobs)
        if token_ids and kind == "chat":
            response["prompt_token_ids"] = list(finals[0].prompt_token_ids)
        return response

    def stream(self, kind: str, response_id: str, n: int, num_prompts: int,
               echo: list[tuple[str, list[int]]] | None = None,
               num_top: int = 0,
               prompt_token_ids: list[list[int]] | None = None,
               usage_prompt_tokens: list[int] | None = None) -> StreamState:
        return StreamState(self, kind, response_id, n, num_prompts, echo, num_top,
                           prompt_token_ids, usage_prompt_tokens)


def _joined(head: dict, tail: dict) -> dict:
    """Two legacy completions logprobs objects, one after the other."""
    return {key: head[key] + tail[key] for key in head}


def usage(finals: list[RequestOutput]) -> dict:
    prompt_tokens = sum(len(out.prompt_token_ids) for out in finals)
    completion_tokens = sum(len(o.token_ids) for out in finals for o in out.outputs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class StreamState:
    """What each choice of one streamed response has been sent so far."""

    def __init__(self, builder: ResponseBuilder, kind: str, response_id: str, n: int,
                 num_prompts: int, echo: list[tuple[str, list[int]]] | None = None,
                 num_top: int = 0, prompt_token_ids: list[list[int]] | None = None,
                 usage_prompt_tokens: list[int] | None = None) -> None:
        """echo (completions): per prompt, its text and token ids, which lead each of its
        choices' first chunk (with their logprobs where the request has logprobs, num_top
        of them per token). prompt_token_ids (vLLM's return_token_ids; None: not asked): per
        prompt, the ids that ran; the chunks then carry `prompt_token_ids` and `token_ids`
        (module docstring). usage_prompt_tokens (continuous usage; None: not asked): per
        prompt, its tokens; every chunk with a choice then carries that choice's `usage`
        (module docstring). With either, `text_sse` (no ids, no usage, no token counts)
        declines every chunk, so all go through `update_one`."""
        self.builder, self.kind, self.response_id, self.n = builder, kind, response_id, n
        self.num_choices = n * num_prompts
        self.created = int(time.time())
        self.num_sent_logprobs = [0] * self.num_choices
        self.text_offsets = [0] * self.num_choices
        self.finished = [False] * self.num_choices
        self.echo, self.num_top = echo, num_top
        self.echoed = [echo is None] * self.num_choices  # its prompt sent (or none to send)
        self._sse_prefix: str | None = None
        self.prompt_token_ids = prompt_token_ids
        self.num_sent_ids = [0] * self.num_choices  # (with prompt_token_ids)
        self.sent_prompt_ids = [False] * self.num_choices
        self.usage_prompt_tokens = usage_prompt_tokens
        self.num_tokens = [0] * self.num_choices  # generated so far (for continuous usage)
        self.per_chunk_fields = prompt_token_ids is not None or usage_prompt_tokens is not None

    def _chunk(self, choices: list[dict]) -> dict:
        return {"id": self.response_id, "object": "chat.completion.chunk" if self.kind == "chat"
                else "text_completion", "created": self.created,
                "model": self.builder.model_name, "choices": choices}

    def _with_usage(self, chunk: dict, index: int) -> dict:
        """`chunk` (of choice `index`) with that choice's usage so far, where asked."""
        if self.usage_prompt_tokens is not None:
            prompt_tokens = self.usage_prompt_tokens[index // self.n]
            completion_tokens = self.num_tokens[index]
            chunk["usage"] = {"prompt_tokens": prompt_tokens,
                              "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens}
        return chunk

    def start(self) -> list[dict]:
        """Chat streams open every choice with the assistant role (OpenAI does)."""
        if self.kind != "chat":
            return []
        chunks = [self._with_usage(self._chunk([{"index": i, "delta": {"role": "assistant",
                                                                       "content": ""},
                                                 "logprobs": None, "finish_reason": None}]), i)
                  for i in range(self.num_choices)]
        if self.prompt_token_ids is not None:
            for chunk in chunks:
                chunk["prompt_token_ids"] = list(self.prompt_token_ids[0])
        return chunks

    def text_sse(self, prompt_index: int, o: CompletionOutput) -> str | None:
        """The SSE event of the common chunk (new text, no logprobs, not finished) as one string
        built from a template (about 3x cheaper than a dict through json.dumps; the server
        writes one per stream per engine step); None for any other chunk, and for every chunk
        of a stream whose chunks carry token ids or usage (use `update_one`)."""
        if self.per_chunk_fields or o.finished or o.logprobs is not None or not o.delta_text:
            return None
        index = prompt_index * self.n + o.index
        if self.finished[index] or not self.echoed[index]:
            return None
        if self._sse_prefix is None:
            head = json.dumps({"id": self.response_id, "object": "chat.completion.chunk"
                               if self.kind == "chat" else "text_completion",
                               "created": self.created, "model": self.builder.model_name},
                              ensure_ascii=False, separators=(",", ":"))
            self._sse_prefix = "data: " + head[:-1] + ',"choices":[{"index":'
        body = (',"logprobs":null,"finish_reason":null,"delta":{"content":' if self.kind == "chat"
                else ',"logprobs":null,"finish_reason":null,"text":')
        close = "}}]}\n\n" if self.kind == "chat" else "}]}\n\n"
        return (f"{self._sse_prefix}{index}{body}"
                f"{json.dumps(o.delta_text, ensure_ascii=False)}{close}")

    def update_one(self, prompt_index: int, o: CompletionOutput,
                   prompt_logprobs: list | None = None) -> list[dict]:
        """A chunk for one choice if it has new text, new logprobs or just finished (or its
        echoed prompt is still to send; prompt_logprobs: its prompt's entries, for that)."""
        chunk = self._choice_chunk(prompt_index, o, prompt_logprobs)
        return [] if chunk is None else [chunk]

    def _choice_chunk(self, prompt_index: int, o: CompletionOutput,
                      prompt_logprobs: list | None = None) -> dict | None:
        index = prompt_index * self.n + o.index
        if self.finished[index]:
            return None
        self.num_tokens[index] = len(o.token_ids)
        echo_text, echo_logprobs = "", None
        if not self.echoed[index]:
            self.echoed[index] = True
            echo_text, token_ids = self.echo[prompt_index]
            if o.logprobs is not None:
                echo_logprobs, self.text_offsets[index] = self.builder.echo_logprobs(
                    token_ids, prompt_logprobs, self.num_top)
        new_logprobs = None
        if o.logprobs is not None:
            new_logprobs = o.logprobs[self.num_sent_logprobs[index]:]
            self.num_sent_logprobs[index] = len(o.logprobs)
        if (not o.delta_text and not new_logprobs and not o.finished and not echo_text
                and echo_logprobs is None):
            return None
        self.finished[index] = o.finished
        logprobs = self.builder._logprobs(self.kind, new_logprobs, self.text_offsets[index])
        if logprobs is not None and self.kind != "chat":
            self.text_offsets[index] += sum(len(self.builder.token_text(e.token_id))
                                            for e in new_logprobs)
        if echo_logprobs is not None:
            logprobs = _joined(echo_logprobs, logprobs)
        choice = {"index": index, "logprobs": logprobs, "finish_reason": o.finish_reason}
        if o.finished:
            choice["stop_reason"] = o.stop_reason
        if self.kind == "chat":
            choice["delta"] = {"content": o.delta_text} if o.delta_text else {}
        else:
            choice["text"] = echo_text + o.delta_text
        if self.prompt_token_ids is not None:
            if self.kind != "chat" and not self.sent_prompt_ids[index]:
                self.sent_prompt_ids[index] = True
                choice["prompt_token_ids"] = list(self.prompt_token_ids[prompt_index])
            choice["token_ids"] = list(o.token_ids[self.num_sent_ids[index]:])
            self.num_sent_ids[index] = len(o.token_ids)
        return self._with_usage(self._chunk([choice]), index)

    def usage_chunk(self, finals: list[RequestOutput]) -> dict:
        chunk = self._chunk([])
        chunk["usage"] = usage(finals)
        return chunk
