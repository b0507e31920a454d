"""A streamed response's output as the Responses API's typed server-sent events.

The chat machinery's stream deltas (reasoning text, answer text, a call's head then its arguments) open, fill and
close output items: each item is announced (`response.output_item.added`), its text streamed in deltas and
finished (`*.done`, then `response.output_item.done`); the items at the end are the response's `output`.
"""

from __future__ import annotations

from typing import Any

from infer.server.responses import json_text
from infer.server.responses_items import call_item, item_id, message_item, output_text, reasoning_item


def sse_event(payload: dict[str, Any]) -> str:
    """One event as OpenAI sends it: the event's type on its own line, then its JSON."""
    return f"event: {payload['type']}\ndata: {json_text(payload)}\n\n"


class OutputEvents:
    """The events of one response, numbered in order (`sequence_number`), and the output items they built."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []  # the output so far; the last is still streaming while `_open`
        self._open: str | None = None  # "reasoning", "message" or "call"
        self._text = ""  # the open item's text (or a call's arguments)
        self._sequence = 0

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse_event(payload)

    def feed(self, deltas: list[dict[str, Any]]) -> list[str]:
        """The events of a step's chat deltas."""
        out: list[str] = []
        for delta in deltas:
            if "reasoning_content" in delta:
                out += self._text_delta("reasoning", delta["reasoning_content"])
            elif "content" in delta:
                out += self._text_delta("message", delta["content"])
            else:
                call = delta["tool_calls"][0]
                function = call["function"]
                if "id" in call:
                    out += self._close(True) + self._add("call", call_item(call["id"], function["name"], ""))
                else:
                    out += self._arguments(function["arguments"])
        return out

    def close(self, complete: bool) -> list[str]:
        """The events that finish the output: the open item done, or one empty message when there was none."""
        out = self._close(complete)
        if not self.items:
            out += self._add("message", message_item("", complete)) + self._close(complete)
        return out

    @property
    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _add(self, kind: str, item: dict[str, Any]) -> list[str]:
        self.items.append(item)
        self._open, self._text = kind, ""
        out = [self.event("response.output_item.added", output_index=len(self.items) - 1, item=_opened(item))]
        if kind != "call":
            part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else output_text("")
            out.append(self.event("response.content_part.added", **self._where, content_index=0, part=part))
        return out

    def _text_delta(self, kind: str, text: str) -> list[str]:
        out = [] if self._open == kind else self._close(True) + self._add(kind, _empty(kind))
        self._text += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return out + [self.event(name, **self._where, content_index=0, delta=text, **extra)]

    def _arguments(self, arguments: str) -> list[str]:
        self._text += arguments
        return [self.event("response.function_call_arguments.delta", **self._where, delta=arguments)]

    def _close(self, complete: bool) -> list[str]:
        if self._open is None:
            return []
        kind, text, item, where = self._open, self._text, self.items[-1], self._where
        self._open = None
        if kind == "call":
            item["arguments"] = text
            out = [self.event("response.function_call_arguments.done", **where, arguments=text)]
        else:
            done = reasoning_item(text, complete, item["id"]) if kind == "reasoning" else \
                message_item(text, complete, item["id"])
            item.update(done)
            part = item["content"][0]
            if kind == "reasoning":
                out = [self.event("response.reasoning_text.done", **where, content_index=0, text=text)]
            else:
                out = [self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])]
            out.append(self.event("response.content_part.done", **where, content_index=0, part=part))
        return out + [self.event("response.output_item.done", output_index=where["output_index"], item=item)]


def _empty(kind: str) -> dict[str, Any]:
    return reasoning_item("", True) if kind == "reasoning" else message_item("", True)


def _opened(item: dict[str, Any]) -> dict[str, Any]:
    """An item as announced: in progress, no content yet."""
    opened = {**item, "status": "in_progress"}
    if "content" in opened:
        opened["content"] = []
    return opened
