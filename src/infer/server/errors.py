"""OpenAI-style error bodies for every failure the server can answer.

400 malformed or unsupported (bad JSON, unknown or refused fields, too long for the context, more
parts than the queue holds), 404 unknown route or model, 405 wrong method, 408 a stalled request body,
413 a body over the size limit, 422 invalid values, 500 an unexpected exception (logged once, the server
keeps serving), 503 the waiting queue is full.
Every body is `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("infer.server")

# pydantic error types that mean "not a well-formed request" rather than "a bad value"
MALFORMED = {"json_invalid", "missing", "model_type", "model_attributes_type", "dict_type", "string_unicode"}
PROBE_FIELDS = {"probes", "probe_prompt", "probe_stop"}  # any error in these is a 400 (docs/omniscience.md)
ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
               422: "invalid_request_error", 500: "internal_error", 503: "overloaded_error"}
RETRY_AFTER_SECONDS = 1
MAX_ROUTE_CHARS = 200  # of an unknown route echoed in its 404


class APIError(Exception):
    """An error answered with `status` and an OpenAI-style body; `param` names the offending field.

    `code` is OpenAI's machine-readable code where one exists (`model_not_found`,
    `context_length_exceeded`, `unsupported_parameter`); otherwise the status.
    """

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def _printable(text: str | None) -> str | None:
    """Text as valid UTF-8: a lone surrogate the client sent (e.g. in a field name) is escaped, not fatal."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, object]:
    return {"error": {"message": _printable(message), "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": _printable(param), "code": code or status}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc.status, exc.message, exc.param, exc.code)


async def validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's body validation: malformed JSON, missing or unknown fields are 400, bad values 422."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "malformed JSON body")
    unknown = [".".join(str(p) for p in e.get("loc", ())[1:]) for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        return error_response(400, f"unsupported field(s): {', '.join(unknown)}; this server does not accept them",
                              unknown[0], "unsupported_parameter")
    status = 400 if any(e.get("type") in MALFORMED or _probe_field(e) for e in errors) else 422
    names = [_param(e) for e in errors]
    field = names[0] if names and names[0] != "body" else None
    message = "; ".join(f"{name}: {e.get('msg')}" for name, e in zip(names[:5], errors[:5]))
    return error_response(status, message, field)


def _param(error: dict) -> str:
    """The field an error is about: its path without the body prefix (a union's member names dropped)."""
    loc = [str(p) for p in error.get("loc", ())[1:]]
    if loc[:1] == ["probes"]:  # `true or a list of names`: pydantic reports each alternative by type name
        return "probes"
    return ".".join(loc) or "body"


def _probe_field(error: dict) -> bool:
    loc = error.get("loc", ())
    return len(loc) > 1 and loc[1] in PROBE_FIELDS


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (unknown route, wrong method, a body that is not UTF-8 JSON) in OpenAI's shape; an
    unknown route's message names it."""
    assert isinstance(exc, HTTPException)
    message = str(exc.detail)
    if exc.status_code == 404:
        route = f"{request.method} {request.url.path}"
        message = f"Invalid URL ({route[:MAX_ROUTE_CHARS]}): no such route"
    response = error_response(exc.status_code, message)
    response.headers.update(exc.headers or {})
    return response


class LastResortMiddleware:
    """An exception no handler expected answers 500 in the same shape, with its traceback logged once.

    Pure ASGI (not Starlette's `Exception` handler, which re-raises so the server logs the error a
    second time, nor BaseHTTPMiddleware, which buffers streams). Once a stream has started nothing
    more can be sent: the error is logged and the connection closes.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            log.error("unexpected error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:
                await error_response(500, f"internal server error: {type(exc).__name__}")(scope, receive, send)
