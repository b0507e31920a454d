"""The access policy (`access.py`) as ASGI middleware: the Host check outermost, then CORS, then the API key; every
refusal in OpenAI's error shape."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from infer.server.access import OPEN_PATHS, AccessPolicy
from infer.server.errors import error_response

MAX_ECHOED_CHARS = 200  # of a refused Host or Origin header echoed in its error


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((value for key, value in scope["headers"] if key == name), None)


class HostCheckMiddleware:
    """421 for a request whose Host header the policy does not allow (see the module's docstring)."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = _header(scope, b"host") if scope["type"] == "http" else None
        if scope["type"] == "http" and (host is None or not self.policy.host_allowed(host.decode("latin-1"))):
            shown = "no Host header" if host is None else f"Host {host.decode('latin-1')[:MAX_ECHOED_CHARS]!r}"
            message = (f"{shown} is not served here: this server answers loopback names (localhost, 127.0.0.1, "
                       "[::1]) and the names of --allowed-hosts")
            await error_response(421, message, "Host", "invalid_host")(scope, receive, send)
            return
        await self.app(scope, receive, send)


class ApiKeyMiddleware:
    """401 for a request without the API key, on every path but OPEN_PATHS."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            authorization = _header(scope, b"authorization")
            if not self.policy.key_matches(authorization):
                message = ("Incorrect API key provided" if authorization is not None else
                           "Missing API key: send it as the header 'Authorization: Bearer KEY'")
                response = error_response(401, message, "Authorization", "invalid_api_key")
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class CorsMiddleware(CORSMiddleware):
    """Starlette's CORS with a refused preflight in OpenAI's error shape."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        super().__init__(app, allow_origins=policy.allowed_origins, allow_methods=["*"], allow_headers=["*"])

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        origin = request_headers["origin"][:MAX_ECHOED_CHARS]
        refused = error_response(400, f"{bytes(response.body).decode()} (origin {origin!r}; the server allows "
                                      "the origins of --allowed-origins)", "Origin")
        refused.headers.update({k: v for k, v in response.headers.items() if k.startswith("access-control-")
                                or k == "vary"})
        return refused


def install_access(app: FastAPI, policy: AccessPolicy) -> None:
    """Add the policy's middleware around what the app has so far: the key, then CORS, then the Host check outermost."""
    if policy.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, policy=policy)
    if policy.allowed_origins:
        app.add_middleware(CorsMiddleware, policy=policy)
    if policy.checks_host:
        app.add_middleware(HostCheckMiddleware, policy=policy)
