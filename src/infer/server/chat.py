"""POST /v1/chat/completions: a conversation rendered through our chat template, streamed as deltas or whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from infer.server.errors import APIError
from infer.server.generation import Choice, Generation, expand
from infer.server.protocol import ChatCompletionRequest, ChatMessage
from infer.server.responses import chat_logprobs, envelope, sse, stream_error, usage
from infer.server.sampling import check_supported, sampling_params
from infer.server.state import ServerState

router = APIRouter()
ROLES = ("system", "user", "assistant")


def plain_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Role/content pairs; content parts must be text and are joined."""
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise APIError(422, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.role!r}", f"messages.{i}.role")
        content = m.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise APIError(422, f"messages[{i}].content: only text parts are supported", f"messages.{i}.content")
            content = "".join(part.text or "" for part in content)
        out.append({"role": m.role, "content": content or ""})
    return out


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.infer
    state.check_model(body.model)
    check_supported(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(422, "top_logprobs requires logprobs=true", "top_logprobs")
    ids = state.encode_chat(plain_messages(body.messages))
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_tokens = max(state.max_seq_len - len(ids), 1) if limit is None else limit
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    gen = Generation(state.engine, expand([ids], sampling_params(body, max_tokens, logprobs=logprobs), body.n), "chatcmpl")
    view = _ChatView(state, body, len(ids), gen)
    if body.stream:
        return StreamingResponse(view.stream(), media_type="text/event-stream")
    return JSONResponse(view.response(await gen.collect(request)))


class _ChatView:
    def __init__(self, state: ServerState, body: ChatCompletionRequest, prompt_tokens: int, gen: Generation) -> None:
        self.state, self.body, self.prompt_tokens, self.gen = state, body, prompt_tokens, gen

    def _envelope(self, kind: str, choices: list, **extra: object) -> dict[str, object]:
        return envelope(kind, self.gen.id, self.state.created, self.state.model_name, choices, **extra)

    def response(self, choices: list[Choice]) -> dict[str, object]:
        body = [
            {"index": c.index, "finish_reason": c.finish_reason,
             "message": {"role": "assistant", "content": c.text},
             "logprobs": chat_logprobs(c.logprobs, self.state.token_text) if self.body.logprobs else None}
            for c in choices
        ]
        completion = sum(len(c.token_ids) for c in choices)
        return self._envelope("chat.completion", body, usage=usage(self.prompt_tokens, completion))

    async def stream(self) -> AsyncIterator[str]:
        for index in range(len(self.gen.jobs)):
            delta = {"role": "assistant", "content": ""}
            yield sse(self._envelope("chat.completion.chunk", [{"index": index, "delta": delta, "finish_reason": None}]))
        completion = 0
        async for index, out in self.gen.events():
            if out.error:
                yield stream_error(out.error)
                return
            lps = [out.logprob] if out.logprob is not None else []
            if not (out.text_delta or out.finished or lps):
                continue
            choice = {"index": index, "delta": {"content": out.text_delta} if out.text_delta else {},
                      "logprobs": chat_logprobs(lps, self.state.token_text) if self.body.logprobs else None,
                      "finish_reason": out.finish_reason if out.finished else None}
            completion += out.completion_tokens if out.finished else 0
            yield sse(self._envelope("chat.completion.chunk", [choice]))
        if self.body.include_usage:
            yield sse(self._envelope("chat.completion.chunk", [], usage=usage(self.prompt_tokens, completion)))
        yield sse("[DONE]")
