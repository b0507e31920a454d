"""vLLM-shaped /tokenize, /detokenize and /tokenizer_info, so lm-eval's remote tokenizer works against us."""

from __future__ import annotations

from fastapi import APIRouter, Request

from infer.server.chat import plain_messages
from infer.server.errors import APIError
from infer.server.openapi import ERROR_RESPONSES
from infer.server.protocol import DetokenizeRequest, TokenizeRequest
from infer.server.state import ServerState

router = APIRouter()


@router.post("/tokenize", responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, object]:
    state: ServerState = request.app.state.infer
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", "prompt")
    if body.messages is not None:  # the template writes the special tokens: add_special_tokens has no say
        ids = await state.encode_chat_async(plain_messages(body.messages), body.add_generation_prompt)
    else:
        ids = await state.encode_async(body.prompt or "", "prompt", add_special_tokens=body.add_special_tokens)
    strs = [state.token_text(t) for t in ids] if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.max_seq_len, "tokens": ids, "token_strs": strs}


@router.post("/detokenize", responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, str]:
    state: ServerState = request.app.state.infer
    state.check_model(body.model)
    state.check_token_ids(body.tokens, "tokens")
    return {"prompt": state.decode(body.tokens, skip_special_tokens=False)}


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict[str, object]:
    state: ServerState = request.app.state.infer
    tokenizer = state.built.tokenizer
    eos_ids = sorted(tokenizer.eos_token_ids)
    eos = tokenizer.specials.eos or (state.token_text(eos_ids[0]) if eos_ids else None)
    return {
        "tokenizer_class": tokenizer.kind,
        "bos_token": tokenizer.specials.bos,
        "eos_token": eos,
        "pad_token": tokenizer.specials.pad,
        "eos_token_ids": eos_ids,
        "model_max_length": state.max_seq_len,
        "vocab_size": state.built.tokenizer.vocab_size,
        "chat_template": state.chat_template,
    }
