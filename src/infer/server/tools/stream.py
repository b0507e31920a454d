"""Tool calls out of a growing text: content goes out as it comes, a call once it is complete.

No tool-call markup reaches the content: text that may be the start of a call is held back until it is
known not to be. A call that turns out malformed, or is cut off by the end of generation, goes out as the
content it was, as the non-streamed parser leaves it.
"""

from __future__ import annotations

from infer.server.tools.formats import PYTHON_TAG, HermesFormat, LlamaJsonFormat, ParsedCall, ToolFormat

Event = tuple[str, "str | ParsedCall"]  # ("content", text) or ("call", call)


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (held back: the marker may be arriving)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class HermesStream:
    def __init__(self, names: set[str]) -> None:
        self.names = names
        self._buffer = ""
        self._in_call = False
        self._started = False  # some content went out (leading whitespace is dropped, as the parser strips it)

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            marker = HermesFormat.CLOSE if self._in_call else HermesFormat.OPEN
            at = self._buffer.find(marker)
            if at < 0:
                break
            if self._in_call:
                body = self._buffer[:at]
                call = HermesFormat.body(body, self.names)
                events += [("call", call)] if call is not None else self._content(HermesFormat.OPEN + body + marker)
            else:
                events += self._content(self._buffer[:at].rstrip())
            self._buffer = self._buffer[at + len(marker) :]
            self._in_call = not self._in_call
        if not self._in_call:
            keep = held_prefix(self._buffer, HermesFormat.OPEN)
            stripped = self._buffer[: len(self._buffer) - keep]
            ready = stripped.rstrip()
            events += self._content(ready)
            self._buffer = self._buffer[len(ready) :]
        return events

    def close(self) -> list[Event]:
        rest = (HermesFormat.OPEN if self._in_call else "") + self._buffer
        self._buffer, self._in_call = "", False
        return self._content(rest.rstrip() if self._started else rest.strip())

    def _content(self, text: str) -> list[Event]:
        if not self._started:
            text = text.lstrip()
        if not text:
            return []
        self._started = True
        return [("content", text)]


class LlamaJsonStream:
    """The calls are the whole answer: once it opens with "{" (or <|python_tag|>) it is held and parsed at the end."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self._buffer = ""
        self._mode = "undecided"  # then "text" or "calls"

    def feed(self, text: str) -> list[Event]:
        if self._mode == "text":
            return [("content", text)] if text else []
        self._buffer += text
        head = self._buffer.lstrip()
        if self._mode == "undecided" and head and not PYTHON_TAG.startswith(head):
            self._mode = "calls" if head.startswith(("{", PYTHON_TAG)) else "text"
            if self._mode == "text":
                out, self._buffer = self._buffer, ""
                return [("content", out)]
        return []

    def close(self) -> list[Event]:
        text, self._buffer = self._buffer, ""
        if not text:
            return []
        content, calls = LlamaJsonFormat().parse(text, self.names)
        return [("call", c) for c in calls] if calls else [("content", content or "")]


def tool_stream(fmt: ToolFormat, names: set[str]) -> HermesStream | LlamaJsonStream:
    return LlamaJsonStream(names) if isinstance(fmt, LlamaJsonFormat) else HermesStream(names)
