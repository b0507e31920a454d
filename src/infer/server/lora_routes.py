"""vLLM's run-time LoRA routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter (docs/lora.md). The core
checks the adapter and tells every API server the new set; a refusal is a 400 that says why."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from infer.frontend.client import CoreGoneError
from infer.server.errors import APIError
from infer.server.openapi import ERROR_RESPONSES
from infer.server.state import ServerState

router = APIRouter()


class LoadLoRARequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRARequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None  # vLLM's clients send it; adapters are named here


@router.post("/v1/load_lora_adapter", responses=ERROR_RESPONSES)
async def load_lora_adapter(body: LoadLoRARequest, request: Request) -> PlainTextResponse:
    state = _lora_state(request)
    if body.lora_name == state.model_name:
        raise APIError(400, f"lora_name {body.lora_name!r} is the base model's name; give the adapter its own",
                       "lora_name")
    if body.lora_name in state.engine.loras:
        raise APIError(400, f"an adapter named {body.lora_name!r} is already loaded; unload it first", "lora_name")
    await _call(state, "load_lora", body.lora_name, body.lora_path, param="lora_path")
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", responses=ERROR_RESPONSES)
async def unload_lora_adapter(body: UnloadLoRARequest, request: Request) -> PlainTextResponse:
    state = _lora_state(request)
    if body.lora_name not in state.engine.loras:
        raise APIError(404, f"no LoRA adapter named {body.lora_name!r} is loaded", "lora_name", "model_not_found")
    await _call(state, "unload_lora", body.lora_name, param="lora_name")
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _lora_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.infer
    if not state.built.config.enable_lora:
        raise APIError(400, "LoRA adapters are not enabled on this server (start it with --enable-lora)", "lora_name")
    return state


async def _call(state: ServerState, method: str, *args: str, param: str) -> None:
    """Run the core's call; its refusal ("LoRAError: <why>") as a 400 on `param`, or on lora_name when the name is
    at fault (taken meanwhile by a concurrent load), or a 404 when the adapter was unloaded meanwhile."""
    try:
        await state.engine.call(method, *args)
    except CoreGoneError as exc:
        raise APIError(503, f"the engine is gone: {exc}") from exc
    except RuntimeError as exc:
        message = str(exc).removeprefix("LoRAError: ")
        if "no adapter named" in message:
            raise APIError(404, message, "lora_name", "model_not_found") from exc
        raise APIError(400, message, "lora_name" if "already loaded" in message else param) from exc
