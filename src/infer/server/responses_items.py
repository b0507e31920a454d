"""A Responses request in chat-completions terms, and a chat answer as Responses output items.

The conversation becomes chat messages and the options a ChatCompletionRequest, so the chat machinery renders,
constrains and parses it as it does a chat request; its answer (reasoning, text, tool calls) becomes output items.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from infer.server.errors import APIError
from infer.server.protocol import ChatCompletionRequest
from infer.server.responses_protocol import (
    TEXT_PARTS, ContentPart, FunctionCallItem, FunctionCallOutputItem, FunctionToolSpec, Item, MessageItem,
    ResponsesRequest, TextConfig,
)
from infer.server.state import check_text
from infer.server.tools.request import tool_arguments

PART_FIELDS = {"annotations", "logprobs"}  # what an output_text part sent back carries besides its text
RENAMED = {"response_format": "text.format", "max_tokens": "max_output_tokens",
           "max_completion_tokens": "max_output_tokens", "messages": "input", "prompt": "input"}


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def conversation(items: list[tuple[str, Item]]) -> list[dict[str, Any]]:
    """Chat messages of (param, item) pairs: a function_call joins the assistant turn before it (or opens one),
    a function_call_output is a tool message; reasoning items are dropped, as chat templates drop past reasoning."""
    messages: list[dict[str, Any]] = []
    for param, item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": _text(item.content, f"{param}.content")})
        elif isinstance(item, FunctionCallItem):
            tool_arguments(item.arguments, f"{param}.arguments")
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": _text(item.output, f"{param}.output")})
    return messages


def _text(content: str | list[ContentPart], param: str) -> str:
    if isinstance(content, str):
        return check_text(content, param)
    for j, part in enumerate(content):
        if part.type not in TEXT_PARTS or part.text is None or set(part.model_extra or ()) - PART_FIELDS:
            raise APIError(400, f"{param}[{j}]: only text parts ({{'type': 'input_text', 'text': ...}}) are "
                                "supported", f"{param}.{j}", "unsupported_parameter")
        check_text(part.text, f"{param}.{j}.text")
    return "".join(part.text or "" for part in content)


def chat_request(body: ResponsesRequest, messages: list[dict[str, Any]],
                 tools: list[FunctionToolSpec]) -> ChatCompletionRequest:
    """The chat request that generates this response: its sampling, tools, output format and thinking."""
    fields: dict[str, Any] = {
        "model": body.model, "messages": messages, "max_completion_tokens": body.max_output_tokens,
        "tools": [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                  for t in tools] or None,
        "tool_choice": _tool_choice(body.tool_choice), "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _response_format(body.text, bool(tools) and body.tool_choice != "none"),
        "reasoning_effort": body.reasoning.effort if body.reasoning is not None else None,
    }
    fields.update({k: v for k in ("temperature", "top_p") if (v := getattr(body, k)) is not None})
    return ChatCompletionRequest.model_validate(fields)


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise APIError(400, f"tool_choice: {choice.get('type')!r} is not supported; use none, auto, required or "
                            "{\"type\": \"function\", \"name\": ...}", "tool_choice", "unsupported_parameter")
    if not isinstance(choice.get("name"), str) or set(choice) - {"type", "name"}:
        raise APIError(400, "tool_choice: a function choice is {\"type\": \"function\", \"name\": <a tool's name>}",
                       "tool_choice.name")
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: TextConfig | None, with_tools: bool) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type not in ("json_object", "json_schema"):
        raise APIError(400, f"text.format: unknown type {fmt.type!r}; use text, json_object or json_schema",
                       "text.format.type")
    if with_tools:
        raise APIError(400, "text.format cannot be combined with tools; use tool_choice \"none\" or drop the tools",
                       "text.format")
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise APIError(400, "text.format: type json_schema needs a schema", "text.format.schema")
    return {"type": "json_schema", "json_schema": fmt.model_dump(exclude={"type"}, by_alias=True, exclude_none=True)}


def renamed(exc: APIError) -> APIError:
    """An error of the chat machinery named by the Responses request's own fields (text.format, tools.<i>.<field>,
    max_output_tokens, input)."""
    if exc.param is None:
        return exc
    head, _, rest = exc.param.partition(".")
    param = re.sub(r"^tools\.(\d+)\.function\.", r"tools.\1.", exc.param)
    if head in RENAMED:
        param = RENAMED[head] if head in ("messages", "prompt") else ".".join(filter(None, (RENAMED[head], rest)))
    if param == exc.param:
        return exc
    message = exc.message if head in ("messages", "prompt") else exc.message.replace(head, RENAMED.get(head, head))
    return APIError(exc.status, message, param, exc.code)


def output_items(message: dict[str, Any], complete: bool) -> list[dict[str, Any]]:
    """A chat answer (ChatShape.message) as output items: its reasoning, its text, its calls; an answer with none
    of them is one empty message. An answer cut off leaves its last text item incomplete (a call is only ever
    parsed whole)."""
    items = [reasoning_item(message["reasoning_content"], True)] if message.get("reasoning_content") else []
    content = message["content"]
    calls = message.get("tool_calls") or []
    if content or not (items or calls):
        items.append(message_item(content or "", True))
    items += [call_item(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    if not complete and items[-1]["type"] != "function_call":
        items[-1]["status"] = "incomplete"
    return items


def _status(complete: bool) -> str:
    return "completed" if complete else "incomplete"


def reasoning_item(text: str, complete: bool, id_: str | None = None) -> dict[str, Any]:
    return {"id": id_ or item_id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": _status(complete)}


def message_item(text: str, complete: bool, id_: str | None = None) -> dict[str, Any]:
    return {"id": id_ or item_id("msg"), "type": "message", "role": "assistant", "status": _status(complete),
            "content": [output_text(text)]}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, id_: str | None = None) -> dict[str, Any]:
    return {"id": id_ or item_id("fc"), "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}
