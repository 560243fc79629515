"""Incremental detokenization with stop strings, for streaming.

Each new token is decoded in a short window of the tokens before it (the "prefix/read offset"
method of HF's TextStreamer, TGI and vLLM), so the cost per token does not grow with the output:

    token_ids:  ... | prefix_offset ........ read_offset ........ len(token_ids)
                      ^ context, decoded       ^ tokens whose text is not yet
                        only to be diffed        part of the output
                        away

    new text = decode(ids[prefix_offset:]) minus decode(ids[prefix_offset:read_offset])

The context matters: tokenizers drop a leading space or merge bytes differently at the start of a
sequence. When the window's text ends with U+FFFD, the last token ends inside a multi-byte UTF-8
character; nothing is emitted and the offsets stay until a later token completes it.

Text then passes through a stop-string filter, whose state is:

    _parts (safe: sent, or ready to send) | _pending (could be the start of a stop string)

`_pending` is the longest suffix of the text that is a proper prefix of some stop string. A stop
string that matches never crosses into `_parts`, so a delta never contains a matched one.

min_tokens (as vLLM's detokenizer counts it): the text of the first `min_tokens` output tokens
is never searched for a stop string; from token min_tokens + 1 on, a match must end in the new
token's text, and may start in the held-back `_pending` before it. So a stop string inside
the first min_tokens tokens neither ends the request nor cuts its text: it is sent as text.
"""

from __future__ import annotations

from pagedrt.sampling_params import SamplingParams

# Tokens of prompt context decoded with each new token (enough for any merge the tokenizer makes
# across token boundaries; vLLM uses 5 too).
_NUM_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns one request's generated tokens into text deltas; finds stop strings.

    Args:
        tokenizer: an HF tokenizer (anything with ``decode(ids, skip_special_tokens=...)``).
        prompt_token_ids: the prompt; its last tokens give context to the first output token.
        params: uses ``stop``, ``include_stop_str_in_output``, ``min_tokens`` and
            ``skip_special_tokens``.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        # a fast tokenizer's Rust decoder, called directly: the same text as its `decode` with
        # clean_up_tokenization_spaces=False, without the Python wrapper (~4 -> ~1.6 us a call;
        # two calls per token, for every streamed token of the server)
        rust = getattr(tokenizer, "_tokenizer", None)
        self._rust_decode = rust.decode if hasattr(rust, "decode") else None
        context = list(prompt_token_ids[-_NUM_CONTEXT_TOKENS:])
        self._token_ids: list[int] = context  # context tokens + output tokens
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._parts: list[str] = []
        self._num_sent_parts = 0
        self._pending = ""
        self.stop_reason: str | None = None  # the matched stop string
        self.finished = False
        self._num_output = 0  # output tokens received (stop strings count from min_tokens + 1)

    @property
    def output_text(self) -> str:
        """The text so far; a matched stop string is in it only if include_stop_str_in_output."""
        return "".join(self._parts) + self._pending

    def update(self, new_token_ids: list[int], stop_terminated: bool = False) -> str | None:
        """Append tokens; returns the stop string they completed, else None.

        After a match the text ends right before the stop string (or right after it, with
        include_stop_str_in_output) and later tokens are ignored. Within the first
        ``min_tokens`` output tokens no stop string matches (module doc).

        stop_terminated: the last of `new_token_ids` ended the request as a stop token (EOS,
        or one of stop_token_ids). As in vLLM's detokenizer, its text is then left out of the
        output unless include_stop_str_in_output.
        """
        if stop_terminated and not self.params.include_stop_str_in_output:
            new_token_ids = new_token_ids[:-1]
        for token_id in new_token_ids:
            if self.stop_reason is not None:
                break
            self._token_ids.append(token_id)
            self._num_output += 1
            text = self._decode_new(allow_partial=False)
            if text:
                self._add_text(text, self._num_output > self.params.min_tokens)
        return self.stop_reason

    def get_delta(self, finished: bool) -> str:
        """The text that is safe to show and was not returned before.

        With ``finished=True`` the held-back rest is flushed too: a possible stop-string start
        that never completed, and an incomplete UTF-8 character (as U+FFFD, as ``decode`` gives).
        """
        if finished and not self.finished:
            self.finished = True
            if self.stop_reason is None:
                tail = self._decode_new(allow_partial=True)
                self._parts.append(self._pending + tail)
                self._pending = ""
        delta = "".join(self._parts[self._num_sent_parts :])
        self._num_sent_parts = len(self._parts)
        return delta

    def _decode_new(self, allow_partial: bool) -> str:
        """Text of the tokens from read_offset on; "" (offsets kept) while it ends mid-character."""
        if self._read_offset == len(self._token_ids):
            return ""
        skip = self.params.skip_special_tokens
        window = self._token_ids[self._prefix_offset :]
        prefix_text = self._decode(window[: self._read_offset - self._prefix_offset], skip)
        new_text = self._decode(window, skip)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not allow_partial):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return new_text[len(prefix_text) :]

    def _decode(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        if not token_ids:
            return ""
        if self._rust_decode is not None:
            return self._rust_decode(token_ids, skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(
            token_ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def _add_text(self, text: str, match_stop: bool) -> None:
        """Move text through the stop filter: match (only with `match_stop`), or split into
        safe part and pending."""
        buf = self._pending + text
        match = _find_stop(buf, self.params.stop, len(self._pending)) if match_stop else None
        if match is not None:
            start, stop = match
            end = start + len(stop) if self.params.include_stop_str_in_output else start
            safe, self._pending = buf[:end], ""
            self.stop_reason = stop
        else:
            num_held = _stop_prefix_len(buf, self.params.stop)
            safe, self._pending = buf[: len(buf) - num_held], buf[len(buf) - num_held :]
        if safe:
            self._parts.append(safe)


def _find_stop(text: str, stops: list[str], num_old: int) -> tuple[int, str] | None:
    """The stop string match in `text` that ends first (then: starts first), among matches that
    end after `num_old` chars (older text was already searched). That is the match a
    character-by-character stream would meet first, whatever the tokenization.
    """
    best: tuple[int, int, str] | None = None  # (end, start, stop)
    for stop in stops:
        start = text.find(stop, max(0, num_old - len(stop) + 1))
        if start >= 0:
            candidate = (start + len(stop), start, stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    return None if best is None else (best[1], best[2])


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
