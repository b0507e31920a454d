"""Qwen3's reasoning: an answer that opens with <think>...</think> gives that block to `reasoning_content`.

With thinking off (chat_template_kwargs enable_thinking=false) the template pre-fills an empty block and the
answer is all content. An answer cut off inside its block (max_tokens counts both) is all reasoning.
"""

from __future__ import annotations

from infer.server.tools.stream import held_prefix

OPEN, CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning or None, content)."""
    head = text.lstrip()
    if not head.startswith(OPEN):
        return None, text
    inner = head[len(OPEN) :]
    if CLOSE not in inner:
        return inner.strip("\n"), ""
    reasoning, content = inner.split(CLOSE, 1)
    return reasoning.strip("\n"), content.lstrip("\n")


class ReasoningStream:
    """The same split over a growing text: ("reasoning", text) and ("content", text) pieces."""

    def __init__(self) -> None:
        self._state = "start"  # then "thinking" or "answer"
        self._buffer = ""
        self._strip = False  # drop the newlines that open the reasoning, or the answer after </think>

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self._state == "answer":
            text = text.lstrip("\n") if self._strip else text
            self._strip = self._strip and not text
            return [("content", text)] if text else []
        self._buffer += text
        out: list[tuple[str, str]] = []
        if self._state == "start":
            head = self._buffer.lstrip()
            if not head or OPEN.startswith(head):
                return []
            if not head.startswith(OPEN):
                self._state = "answer"
                out.append(("content", self._buffer))
                self._buffer = ""
                return out
            self._state, self._buffer, self._strip = "thinking", head[len(OPEN) :], True
        if self._state == "thinking":
            if self._strip:  # the newlines after <think>
                self._buffer = self._buffer.lstrip("\n")
                self._strip = not self._buffer
            at = self._buffer.find(CLOSE)
            if at < 0:
                ready = self._buffer[: len(self._buffer) - held_prefix(self._buffer, CLOSE)]
                ready = ready.rstrip("\n")
                self._buffer = self._buffer[len(ready) :]
                return [("reasoning", ready)] if ready else []
            reasoning = self._buffer[:at].rstrip("\n")
            out += [("reasoning", reasoning)] if reasoning else []
            self._state, self._strip = "answer", True
            rest, self._buffer = self._buffer[at + len(CLOSE) :], ""
            out += self.feed(rest)
        return out

    def close(self) -> list[tuple[str, str]]:
        rest, self._buffer = self._buffer, ""
        if self._state == "thinking":
            rest = rest.strip("\n")
            return [("reasoning", rest)] if rest else []
        if self._state == "start":
            reasoning, content = split_reasoning(rest)
            return [("content", content)] if content else []
        return []
