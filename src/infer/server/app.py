"""The FastAPI application: routes, error handlers, the OpenAPI document, and the engine client's lifetime."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from infer.server import (chat, completions, embeddings, lora_routes, openapi, probes, prometheus, responses_api,
                          tokenizer_routes)
from infer.server.access_middleware import install_access
from infer.server.body_guard import BodyGuardMiddleware
from infer.server.errors import (
    APIError, LastResortMiddleware, api_error_handler, http_error_handler, validation_error_handler,
)
from infer.server.openapi import ERROR_RESPONSES
from infer.server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.engine.start()
        try:
            yield
        finally:
            await state.engine.close()
            state.workers.close()

    app = FastAPI(title="infer", summary="OpenAI-compatible LLM server", lifespan=lifespan)
    app.state.infer = state
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)
    app.add_middleware(LastResortMiddleware)
    app.add_middleware(BodyGuardMiddleware, max_bytes=state.limits.body_bytes(state.max_seq_len),
                       body_timeout_s=state.limits.body_timeout_s,
                       body_deadline_s=state.limits.body_deadline_s)  # before anything reads the body
    install_access(app, state.limits.access)  # outermost: who may call is known before the body is read
    for module in (completions, chat, responses_api, embeddings, tokenizer_routes, prometheus, probes, lora_routes):
        app.include_router(module.router)

    @app.get("/health", responses={503: ERROR_RESPONSES[503]})
    async def health(request: Request) -> dict[str, object]:
        s: ServerState = request.app.state.infer
        if not s.engine.alive:
            raise APIError(503, f"the engine core is gone: {s.engine.gone_reason}")
        health = {"status": "ok", "api_server": s.api_server_index, "pid": os.getpid(), "core_pid": s.engine.info.pid}
        if len(s.engine.infos) > 1:  # data parallelism: every engine core, and those that are restarting
            health["core_pids"] = [info.pid for info in s.engine.infos]
            if dead := s.engine.dead_engines:
                health.update(status="degraded", dead_engines=dead)
        return health

    @app.get("/version")
    async def package_version() -> dict[str, str]:
        """The installed infer's version (open without the API key, as /health)."""
        return {"version": version("infer")}

    def card(s: ServerState, adapter: str | None = None) -> dict[str, object]:
        """The base model's card, or a LoRA adapter's (vLLM's shape: `root` its path, `parent` the base model)."""
        root, parent = (s.model_name, None) if adapter is None else (s.engine.loras.get(adapter, adapter), s.model_name)
        return {"id": adapter or s.model_name, "object": "model", "created": s.created, "owned_by": "infer",
                "max_model_len": s.max_seq_len, "root": root, "parent": parent}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, object]:
        s: ServerState = request.app.state.infer
        return {"object": "list", "data": [card(s)] + [card(s, name) for name in s.engine.loras]}

    @app.get("/v1/models/{model_id:path}", responses={404: ERROR_RESPONSES[404]})
    async def model(model_id: str, request: Request) -> dict[str, object]:
        s: ServerState = request.app.state.infer
        return card(s, s.check_model(model_id))

    openapi.install(app, state.model_name, state.max_seq_len, state.vocab_size)
    return app
