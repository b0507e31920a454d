"""POST /v1/embeddings: each input's final hidden states pooled as the server's --pooling says, L2-normalized (cut
to `dimensions` and normalized again when asked), as floats or base64 little-endian float32; batched through the
same scheduler as generation (an embedding is a prefill that returns its pooled hidden state and generates nothing)."""

from __future__ import annotations

import base64
import struct

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from infer.frontend.outputs import truncate_embedding
from infer.sampling.params import SamplingParams
from infer.server.completions import prompt_ids
from infer.server.errors import APIError
from infer.server.generation import Generation, Job, client_gone
from infer.server.openapi import ERROR_RESPONSES
from infer.server.protocol import EmbeddingRequest
from infer.server.state import ServerState

router = APIRouter()


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    """The vector as OpenAI sends it: a list of floats, or base64 of its little-endian float32 bytes."""
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


@router.post("/v1/embeddings", responses=ERROR_RESPONSES)
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    state: ServerState = request.app.state.infer
    adapter = state.check_model(body.model)
    hidden = state.built.model_config.hidden_size
    if body.dimensions is not None and not 0 < body.dimensions <= hidden:
        raise APIError(400, f"dimensions must be between 1 and the model's {hidden}, got {body.dimensions}",
                       "dimensions")
    prompts, _ = await prompt_ids(state, body.input, "input")
    state.check_parts(len(prompts))
    for ids in prompts:
        state.check_context(len(ids), 0, "input")
    params = SamplingParams(max_tokens=0, pooling=state.built.config.pooling, lora=adapter)
    gen = Generation(state.engine, [Job(i, ids, params) for i, ids in enumerate(prompts)], "embd", stream=False)
    choices = await gen.collect(request)
    if choices is None:
        return client_gone(gen)
    data = []
    for choice in choices:
        if choice.embedding is None:
            raise APIError(500, "the engine returned no embedding")
        vector = truncate_embedding(choice.embedding, body.dimensions)
        data.append({"object": "embedding", "index": choice.index, "embedding": _encoded(vector, body.encoding_format)})
    tokens = sum(len(p) for p in prompts)
    body_json = msgspec.json.encode({"object": "list", "data": data, "model": state.answered_by(body.model),
                                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
    return Response(body_json, media_type="application/json")  # msgspec: ~15x json.dumps on thousands of floats
