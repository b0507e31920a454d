"""The request body's budget, enforced before anything parses it: too large is a 413 at once, too slow a 408.

A `Content-Length` over the cap is answered before a byte of the body is read; a chunked body is counted as it
arrives and cut off where it passes the cap. A body whose next piece takes longer than `--body-timeout-s`, or that
is not whole `--body-deadline-s` after its headers arrived (a body trickled a byte at a time never stalls), is
answered 408. Either way the connection closes (uvicorn does not keep a connection whose body was not read), and
the application sees a disconnect, so nothing it would send after the answer goes out.
"""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.server.errors import error_response
from infer.server.limits import MIB

DISCONNECT: Message = {"type": "http.disconnect"}


class BodyGuardMiddleware:
    """Pure ASGI: caps and times the request body of every HTTP request."""

    def __init__(self, app: ASGIApp, max_bytes: int, body_timeout_s: float, body_deadline_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s
        self.body_deadline_s = body_deadline_s

    def _too_large(self, size: int | None) -> tuple[int, str, str]:
        shown = f"is {size / MIB:.1f} MiB" if size is not None else "goes"
        return 413, (f"the request body {shown}, over this server's limit of {self.max_bytes / MIB:.1f} MiB "
                     f"(--max-request-body-mb)"), "body"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            await _closing(error_response(*self._too_large(length)))(scope, receive, send)
            return
        answered = False
        body_done = False
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_deadline_s

        async def answer(status: int, message: str, param: str) -> Message:
            nonlocal answered
            answered = True
            await _closing(error_response(status, message, param))(scope, receive, send)
            return DISCONNECT

        async def guarded_receive() -> Message:
            nonlocal body_done, received
            if answered:
                return DISCONNECT
            if body_done:
                return await receive()  # after the body: only a disconnect can come
            left = deadline - loop.time()
            try:
                message = await asyncio.wait_for(receive(), min(self.body_timeout_s, max(0.0, left)))
            except TimeoutError:
                if left <= self.body_timeout_s:
                    return await answer(408, f"the request body was not complete within {self.body_deadline_s:g} s "
                                             f"(--body-deadline-s)", "body")
                return await answer(408, f"the request body stalled: no data for {self.body_timeout_s:g} s "
                                         f"(--body-timeout-s)", "body")
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    return await answer(*self._too_large(None))
                body_done = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            if not answered:
                await send(message)

        await self.app(scope, guarded_receive, guarded_send)


def _closing(response: Response) -> Response:
    """The response with `Connection: close`: the server then closes the connection once it is sent, where a body
    it did not read would otherwise keep it open for as long as the client trickles that body."""
    response.headers["connection"] = "close"
    return response


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses a malformed length before the application runs
    return None
