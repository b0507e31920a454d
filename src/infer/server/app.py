"""The FastAPI application: routes, error handlers, and the engine thread's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from infer.server import chat, completions, prometheus, tokenizer_routes
from infer.server.errors import APIError, api_error_handler, validation_error_handler
from infer.server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            state.engine.shutdown()

    app = FastAPI(title="infer", summary="OpenAI-compatible LLM server", lifespan=lifespan)
    app.state.infer = state
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    for module in (completions, chat, tokenizer_routes, prometheus):
        app.include_router(module.router)

    @app.get("/health")
    async def health(request: Request) -> dict[str, str]:
        if not request.app.state.infer.engine.alive:
            raise APIError(503, "the engine thread is not running")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, object]:
        s: ServerState = request.app.state.infer
        card = {"id": s.model_name, "object": "model", "created": s.created, "owned_by": "infer",
                "max_model_len": s.max_seq_len}
        return {"object": "list", "data": [card]}

    return app
