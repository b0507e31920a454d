"""The OpenAPI document describes what the server does: every error status with its body, streams as
`text/event-stream`, `/metrics` as Prometheus text, and the served model name as the one valid `model`."""

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
    503: _error("The waiting queue is full; retry after the Retry-After header's seconds"),
}
GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "A JSON response, or server-sent events with stream=true",
          "content": {"application/json": {}, "text/event-stream": {"schema": {"type": "string"}}}},
    **ERROR_RESPONSES,
}
MODEL_BODIES = ("CompletionRequest", "ChatCompletionRequest", "TokenizeRequest", "DetokenizeRequest")


def install(app: FastAPI, model_name: str) -> None:
    """Make app.openapi() publish the served model name as an enum wherever a body names a model."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            components = schema.get("components", {}).get("schemas", {})
            for name in MODEL_BODIES:
                if name in components:
                    components[name]["properties"]["model"] = {
                        "anyOf": [{"type": "string", "enum": [model_name]}, {"type": "null"}],
                        "title": "Model", "description": "the served model name (GET /v1/models)",
                    }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
