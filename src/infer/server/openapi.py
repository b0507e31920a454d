"""The OpenAPI document describes what the server does: every error status with its body, streams as
`text/event-stream`, `/metrics` as Prometheus text, and the served model's facts: its name as the one
valid `model`, the context length as the bound of `max_tokens`, the vocabulary as the range of token ids."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int | str


class ErrorResponse(BaseModel):
    error: ErrorDetail


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("Malformed request: bad JSON, a missing, unknown or unsupported field, a prompt beyond the "
                "context (code context_length_exceeded), or more sequences than the server queues"),
    404: _error("The model is not served here (code model_not_found)"),
    422: _error("A field has an invalid value (the error's param names it)"),
    500: _error("An unexpected server error; the server keeps serving"),
    408: _error("The request body stalled for longer than the server's --body-timeout-s"),
    413: _error("The request body is larger than the server's --max-request-body-mb"),
    503: _error("The waiting queue is full; retry after the Retry-After header's seconds"),
}
# One server-sent event as a parser of `text/event-stream` reads it (OpenAPI 3.2's generic event schema; OpenAPI 3.0
# and 3.1 tools such as schemathesis apply `schema` to each event): `data` is a chunk as JSON, or `[DONE]` last.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "contentMediaType": "application/json",
                            "description": "one chunk (a JSON object), an error object, or [DONE] at the end"},
                   "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer", "minimum": 0}},
}
GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "A JSON response, or server-sent events with stream=true",
          "content": {"application/json": {}, "text/event-stream": {"schema": SSE_EVENT_SCHEMA}}},
    **ERROR_RESPONSES,
}
MODEL_BODIES = ("CompletionRequest", "ChatCompletionRequest", "ResponsesRequest", "TokenizeRequest",
                "DetokenizeRequest", "EmbeddingRequest")


def install(app: FastAPI, model_name: str, max_seq_len: int, vocab_size: int) -> None:
    """Make app.openapi() publish the served model's name, context length and vocabulary in the schemas."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            _publish_model(schema.get("components", {}).get("schemas", {}), model_name, max_seq_len, vocab_size)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _publish_model(components: dict[str, Any], model_name: str, max_seq_len: int, vocab_size: int) -> None:
    for name in MODEL_BODIES:
        properties = components.get(name, {}).get("properties", {})
        properties["model"] = {"anyOf": [{"type": "string", "enum": [model_name]}, {"type": "null"}],
                               "title": "Model", "description": "the served model name (GET /v1/models)"}
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            for option in properties.get(field, {}).get("anyOf", []):
                if option.get("type") == "integer":
                    option["maximum"] = max_seq_len - 1  # the prompt takes at least one position
        for field in ("prompt", "tokens"):
            _bound_token_ids(properties.get(field, {}), vocab_size)


def _bound_token_ids(node: Any, vocab_size: int) -> None:
    """Every integer inside a prompt or token list is a token id: 0 <= id < vocab_size."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            node.update(minimum=0, maximum=vocab_size - 1)
        for value in node.values():
            _bound_token_ids(value, vocab_size)
    elif isinstance(node, list):
        for value in node:
            _bound_token_ids(value, vocab_size)
