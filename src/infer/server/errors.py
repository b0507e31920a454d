"""OpenAI-style error bodies and the status codes of the API: 400 malformed, 422 invalid, 503 overloaded."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

# pydantic error types that mean "not a well-formed request" rather than "a bad value"
MALFORMED = {"json_invalid", "missing", "model_type", "model_attributes_type", "dict_type"}
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 422: "invalid_request_error",
               500: "internal_error", 503: "overloaded_error"}


class APIError(Exception):
    """An error answered with `status` and an OpenAI-style body; `param` names the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "param": param, "code": status}}


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return JSONResponse(error_body(exc.status, exc.message, exc.param), status_code=exc.status)


async def validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's body validation: malformed JSON or missing fields are 400, bad values 422."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    malformed = any(e.get("type") in MALFORMED for e in errors)
    status = 400 if malformed else 422
    if any(e.get("type") == "json_invalid" for e in errors):
        return JSONResponse(error_body(400, "malformed JSON body"), status_code=400)
    names = [".".join(str(p) for p in e.get("loc", ())[1:]) or "body" for e in errors]
    field = names[0] if names and names[0] != "body" else None
    message = "; ".join(f"{name}: {e.get('msg')}" for name, e in zip(names[:5], errors[:5]))
    return JSONResponse(error_body(status, message, field), status_code=status)
