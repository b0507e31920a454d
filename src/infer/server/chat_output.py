"""A chat choice's text as OpenAI's assistant message: Qwen3's <think> block to reasoning_content, tool calls to
tool_calls (finish_reason "tool_calls"), the rest to content; whole, or as stream deltas."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from infer.server.reasoning import ReasoningStream, split_reasoning
from infer.server.tools.formats import ParsedCall, ToolFormat
from infer.server.tools.request import ToolRequest
from infer.server.tools.stream import tool_stream


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ChatShape:
    """What to take out of a choice's text: the reasoning block (`reasoning`), the calls of `tools` in `fmt`."""

    fmt: ToolFormat
    tools: ToolRequest | None = None
    reasoning: bool = False

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.tools.callable()} if self.tools is not None else set()

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """(the message, the finish reason: "tool_calls" when the model stopped after calling)."""
        reasoning, content = split_reasoning(text) if self.reasoning else (None, text)
        calls: list[ParsedCall] = []
        if self.tools is not None:
            parsed, calls = self.fmt.parse(content, self.names)
            content = parsed if calls else content
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [{"id": call_id(), "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return message, ("tool_calls" if calls and finish_reason == "stop" else finish_reason)

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


class ChoiceStream:
    """One choice's deltas: content and reasoning as they come, each call as two deltas (its index, id and name,
    then its arguments) once it is complete."""

    def __init__(self, shape: ChatShape) -> None:
        self._reasoning = ReasoningStream() if shape.reasoning else None
        self._tools = tool_stream(shape.fmt, shape.names) if shape.tools is not None else None
        self.calls = 0

    def feed(self, text: str) -> list[dict[str, Any]]:
        pieces = self._reasoning.feed(text) if self._reasoning is not None else [("content", text)] if text else []
        return self._deltas(pieces, close=False)

    def close(self) -> list[dict[str, Any]]:
        """What was held back, at the end of the choice."""
        pieces = self._reasoning.close() if self._reasoning is not None else []
        return self._deltas(pieces, close=True)

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.calls and reason == "stop" else reason

    def _deltas(self, pieces: list[tuple[str, str]], close: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, text in pieces:
            if kind == "reasoning":
                out.append({"reasoning_content": text})
            elif self._tools is None:
                out.append({"content": text})
            else:
                out += self._events(self._tools.feed(text))
        if close and self._tools is not None:
            out += self._events(self._tools.close())
        return out

    def _events(self, events: list) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, value in events:
            if kind == "content":
                out.append({"content": value})
                continue
            index, self.calls = self.calls, self.calls + 1
            out.append({"tool_calls": [{"index": index, "id": call_id(), "type": "function",
                                        "function": {"name": value.name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": index, "function": {"arguments": value.arguments}}]})
        return out
