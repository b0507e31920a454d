"""Incremental detokenization for streaming: per-token text deltas that never split a UTF-8 character."""

from __future__ import annotations

from collections.abc import Sequence

from infer.loader.tokenizer import Tokenizer

# Prompt tokens decoded ahead of the first generated ones, so that context-dependent spacing renders as in context.
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """vLLM-style prefix/read offsets: re-decode a short window per token and emit only text that is final.

    `ids[prefix_offset:read_offset]` is text already emitted, kept as decoding context; tokens after
    `read_offset` are pending. A delta is emitted once the window's text grows and does not end in
    U+FFFD, i.e. no multi-byte character is still incomplete.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._text = ""

    @property
    def text(self) -> str:
        """All generated text emitted so far."""
        return self._text

    def push(self, token_id: int) -> str:
        """Add one generated token; the new final text (possibly empty while a character is incomplete)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of generation: whatever text was held back (an incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special_tokens)

    def _advance(self, final: bool) -> str:
        prefix = self._decode(self._prefix_offset, self._read_offset)
        window = self._decode(self._prefix_offset, len(self._ids))
        if not final and (len(window) <= len(prefix) or window.endswith("\ufffd")):
            return ""
        delta = window[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._text += delta
        return delta
