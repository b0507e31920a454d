"""Request bodies of POST /v1/responses (OpenAI's Responses API, the subset vLLM serves).

The top-level fields are checked by FastAPI as the other endpoints' are; `input` items and `tools` are checked one
by one by `check_items` / `check_tools`, so an error names `input.<i>.<field>` or `tools.<i>.<field>`, and an item
or tool of a kind infer cannot serve (built-in tools, images, files) is a 400 naming it rather than a schema error.
OpenAI fields that only a neutral value leaves harmless are declared and refused otherwise (`check_refused`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictStr, Tag, TypeAdapter, ValidationError

from infer.server.errors import MALFORMED, APIError

STATUS = Literal["in_progress", "completed", "incomplete"]
TEXT_PARTS = ("input_text", "output_text")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
UNION_LABEL = re.compile(r"^(str|other|[a-z_]+\[.*\])$")  # where pydantic names a union's member, not a field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(BaseModel):
    """A part of a message's content; only text parts are served, others are refused by their type."""

    model_config = ConfigDict(extra="allow")  # an image or file part carries its own fields, refused with the part

    type: str
    text: StrictStr | None = None


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[ContentPart]
    id: str | None = None
    status: STATUS | None = None


class FunctionCallItem(_Body):
    """A call an earlier response made (its output item, sent back)."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr = Field(description="the call's arguments as a JSON object in a string")
    id: str | None = None
    status: STATUS | None = None


class FunctionCallOutputItem(_Body):
    """The result of a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr | list[ContentPart]
    id: str | None = None
    status: STATUS | None = None


class ReasoningText(_Body):
    type: Literal["reasoning_text", "summary_text"]
    text: StrictStr


class ReasoningItem(_Body):
    """An earlier response's reasoning, sent back; accepted, not rendered (chat templates drop past reasoning)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    status: STATUS | None = None


class OtherItem(BaseModel):
    """An item of a kind infer does not serve (a built-in tool's call, an item reference): refused by its type."""

    model_config = ConfigDict(extra="allow")

    type: str


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else None
    return kind if kind in ITEM_TYPES else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionToolSpec(_Body):
    """A function tool in the Responses API's flat shape."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="the arguments' JSON schema")
    strict: bool | None = Field(None, description="accepted; every call is generated under its schema")


class TextFormat(_Body):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: str = Field(description="text, json_object or json_schema")
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")
    description: str | None = None


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="accepted; a hint our models "
                                                                                "cannot follow")


class ReasoningConfig(_Body):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="none or minimal turn a reasoning model's thinking off (Qwen 3's enable_thinking=false); "
                          "others leave it on")


class ResponsesStreamOptions(_Body):
    include_obfuscation: bool | None = Field(None, description="accepted; no obfuscation padding is sent")


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[Any] = Field(description="a user message, or a list of items (messages, function calls "
                                                "and their outputs)")
    instructions: str | None = Field(None, description="a system message before the input (not carried over by "
                                                       "previous_response_id)")
    max_output_tokens: int | None = Field(None, ge=1, description="reasoning and answer; default: the rest of the "
                                                                  "context")
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    tools: list[Any] | None = Field(None, description="function tools only")
    tool_choice: str | dict[str, Any] | None = Field(None, description="none, auto, required or "
                                                                       "{type: function, name}")
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool | None = Field(False, description="typed server-sent events; null: false")
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = Field(None, description="keep the response for previous_response_id and GET (default true)")
    previous_response_id: str | None = None
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]] | None = Field(
        None, max_length=16)
    user: str | None = Field(None, description="an end-user identifier; accepted, has no effect on generation")
    safety_identifier: str | None = Field(None, description="accepted, has no effect")
    prompt_cache_key: str | None = Field(None, description="accepted; prefix caching needs no key")
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(None, description="accepted, has no effect")
    service_tier: str | None = Field(None, description="accepted, has no effect")
    # OpenAI fields refused unless they have their neutral value (check_refused)
    background: Any = None
    conversation: Any = None
    include: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None
    truncation: Any = None


REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {  # field -> (its harmless values, why others are refused)
    "background": ((None, False), "background responses are not supported; wait for the response or stream it"),
    "conversation": ((None,), "conversations are not supported; continue one with previous_response_id"),
    "include": ((None, []), "nothing extra can be included (no logprobs, encrypted reasoning or tool results)"),
    "prompt": ((None,), "stored prompt templates are not supported"),
    "max_tool_calls": ((None,), "is not supported; parallel_tool_calls=false allows one call"),
    "top_logprobs": ((None, 0), "logprobs are not supported here; use /v1/chat/completions"),
    "truncation": ((None, "disabled"), "only \"disabled\": an input beyond the context is a 400"),
}


def check_refused(body: ResponsesRequest) -> None:
    """A 400 naming the first OpenAI field whose value infer cannot honour."""
    for name, (harmless, why) in REFUSED.items():
        value = getattr(body, name)
        if not any(value == h and type(value) is type(h) for h in harmless):
            raise APIError(400, f"{name}: {why}", name, "unsupported_parameter")


_ITEM = TypeAdapter(InputItem)
_TOOL = TypeAdapter(FunctionToolSpec)


def check_items(values: list[Any], param: str = "input") -> list[Item]:
    """Each input item validated (a 400 or 422 naming `input.<i>.<field>`); kinds infer cannot serve refused."""
    items: list[Item] = []
    for i, value in enumerate(values):
        if not isinstance(value, dict):
            raise APIError(400, f"{param}[{i}]: an item is an object (a message, function_call, ...)", f"{param}.{i}")
        item = _validated(_ITEM, value, f"{param}.{i}")
        if isinstance(item, OtherItem):
            raise APIError(400, f"{param}[{i}]: items of type {item.type!r} are not supported; only messages, "
                                "function_call, function_call_output and reasoning items", f"{param}.{i}.type",
                           "unsupported_parameter")
        items.append(item)
    return items


def check_tools(values: list[Any]) -> list[FunctionToolSpec]:
    """Each tool validated; a built-in tool (web_search, file_search, computer, ...) is a 400 naming it."""
    tools = []
    for i, value in enumerate(values):
        kind = value.get("type") if isinstance(value, dict) else None
        if kind is not None and kind != "function":
            raise APIError(400, f"tools[{i}]: built-in tools ({kind!r}) are not supported; only function tools",
                           f"tools.{i}.type", "unsupported_parameter")
        tools.append(_validated(_TOOL, value, f"tools.{i}"))
    return tools


def _validated(adapter: TypeAdapter, value: Any, where: str) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        error = max(exc.errors(), key=lambda e: len(e["loc"]))  # the most specific of a union's errors
        loc = [str(p) for p in error["loc"] if str(p) not in ITEM_TYPES and not UNION_LABEL.match(str(p))]
        param = ".".join([where, *loc])
        if error["type"] == "extra_forbidden":
            raise APIError(400, f"unsupported field: {param}; this server does not accept it", param,
                           "unsupported_parameter") from None
        status = 400 if error["type"] in MALFORMED else 422
        raise APIError(status, f"{param}: {error['msg']}", param) from None
