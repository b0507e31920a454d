"""The request's tools and tool_choice, checked (a 400 names the field), and its messages as the template reads them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infer.server.errors import APIError
from infer.server.protocol import ChatCompletionRequest, ChatMessage

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call; `parameters` is its arguments' JSON schema."""

    name: str
    parameters: dict[str, Any]
    description: str | None = None
    strict: bool = False

    def definition(self) -> dict[str, Any]:
        """OpenAI's tool object, as the chat templates list it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """What the model may (auto), must (required) or must call exactly (named), one call or several (parallel; never
    with a named function)."""

    tools: tuple[FunctionTool, ...]
    choice: str  # "auto", "required" or "named"
    named: str | None = None
    parallel: bool = True

    def callable(self) -> tuple[FunctionTool, ...]:
        """The tools a call may name."""
        return tuple(t for t in self.tools if t.name == self.named) if self.choice == "named" else self.tools

    def definitions(self) -> list[dict[str, Any]]:
        return [t.definition() for t in self.tools]


def tool_request(body: ChatCompletionRequest) -> ToolRequest | None:
    """The request's tools, or None when the model answers in text (no tools, or tool_choice "none")."""
    if body.functions or body.function_call is not None:
        name = "functions" if body.functions else "function_call"
        raise APIError(400, f"{name}: the deprecated functions API is not supported; use tools and tool_choice",
                       name, "unsupported_parameter")
    tools = _tools(body)
    choice = body.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise APIError(400, f"tool_choice must be none, auto, required or a named function, got {choice!r}",
                           "tool_choice")
        if choice != "none" and not tools:
            raise APIError(400, f"tool_choice {choice!r} needs tools", "tool_choice")
        named = None
    else:
        named = choice.function.name
        if named not in {t.name for t in tools}:
            raise APIError(400, f"tool_choice names {named!r}, which is not among the tools", "tool_choice")
        choice = "named"
    if choice == "none":
        return None
    # a named function is called once, as vLLM does; otherwise parallel_tool_calls (OpenAI's default: true) decides
    parallel = choice != "named" and body.parallel_tool_calls is not False
    return ToolRequest(tools, choice, named, parallel)


def _tools(body: ChatCompletionRequest) -> tuple[FunctionTool, ...]:
    out: list[FunctionTool] = []
    for i, tool in enumerate(body.tools or []):
        f = tool.function
        if f.name in {t.name for t in out}:
            raise APIError(400, f"tools[{i}]: a second function named {f.name!r}", f"tools.{i}.function.name")
        parameters = f.parameters if f.parameters is not None else EMPTY_PARAMETERS
        out.append(FunctionTool(f.name, parameters, f.description, bool(f.strict)))
    return tuple(out)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation as the chat templates read it: developer is the system role, text parts are joined,
    assistant tool_calls carry parsed arguments, tool results keep their tool_call_id."""
    out = []
    for i, m in enumerate(messages):
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _text(i, m)}
        if m.tool_calls:
            if m.role != "assistant":
                raise APIError(400, f"messages[{i}]: only assistant messages carry tool_calls",
                               f"messages.{i}.tool_calls")
            message["tool_calls"] = [
                {"id": c.id or f"call_{i}_{j}", "type": "function", "function": {
                    "name": c.function.name,
                    "arguments": tool_arguments(c.function.arguments,
                                                f"messages.{i}.tool_calls.{j}.function.arguments")}}
                for j, c in enumerate(m.tool_calls)
            ]
        if m.role == "tool":
            message["tool_call_id"] = m.tool_call_id or ""
        out.append(message)
    return out


def _text(i: int, m: ChatMessage) -> str:
    content = m.content
    if isinstance(content, list):
        for j, part in enumerate(content):
            if part.type != "text" or part.model_extra:
                raise APIError(400, f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) "
                                    "are supported", f"messages.{i}.content", "unsupported_parameter")
        content = "".join(part.text or "" for part in content)
    return content or ""


MAX_ARGUMENT_DEPTH = 64  # nesting of a tool call's arguments; deeper JSON would recurse in the parser and template


def tool_arguments(text: str, param: str) -> dict[str, Any]:
    """A call's arguments parsed: a JSON object not nested too deeply, else a 400 naming `param`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"{param}: not JSON ({exc})", param) from exc
    except RecursionError as exc:
        raise APIError(400, f"{param}: nested more than {MAX_ARGUMENT_DEPTH} levels deep", param) from exc
    if not isinstance(value, dict):
        raise APIError(400, f"{param}: must be a JSON object, got {type(value).__name__}", param)
    if _depth(value) > MAX_ARGUMENT_DEPTH:
        raise APIError(400, f"{param}: nested more than {MAX_ARGUMENT_DEPTH} levels deep", param)
    return value


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in a parsed JSON value, without recursion."""
    deepest, level = 0, [(value, 1)]
    while level:
        item, depth = level.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            level.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
