"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API on the chat-completions machinery.

A request becomes a chat request (responses_items.py) that is rendered, constrained, generated and parsed as one;
its answer comes back as output items, whole or as typed events (responses_stream.py), and is stored for
previous_response_id and GET unless `store` is false (responses_store.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from infer.server.chat_output import ChatShape
from infer.server.chat_request import answer_constraint, chat_shape, template_arguments
from infer.server.errors import APIError
from infer.server.generation import Choice, Generation, client_gone, event_stream, expand
from infer.server.openapi import ERROR_RESPONSES, GENERATION_RESPONSES
from infer.server.responses_items import chat_request, conversation, item_id, output_items, renamed
from infer.server.responses_protocol import (
    FunctionToolSpec, Item, MessageItem, ResponsesRequest, check_items, check_refused, check_tools,
)
from infer.server.responses_store import StoredResponse
from infer.server.responses_stream import OutputEvents
from infer.server.sampling import sampling_params
from infer.server.state import ServerState, check_text
from infer.server.structured import requested_constraint
from infer.server.tools import template_messages, tool_request

router = APIRouter()
UNFINISHED = {"length": ("incomplete", "max_output_tokens"), "abort": ("cancelled", None)}  # finish -> status


@router.post("/v1/responses", responses=GENERATION_RESPONSES)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    try:
        return await _create(request.app.state.infer, body, request)
    except APIError as exc:
        raise renamed(exc) from None


@router.get("/v1/responses/{response_id}", responses={404: ERROR_RESPONSES[404]})
async def retrieve_response(response_id: str, request: Request) -> dict[str, Any]:
    return _stored(request.app.state.infer, response_id, "response_id").response


def _stored(state: ServerState, response_id: str, param: str) -> StoredResponse:
    stored = state.responses.get(response_id)
    if stored is None:
        raise APIError(404, f"no stored response {response_id!r}: responses live in the memory of the API server "
                            "process that made them (the last --responses-store-size), unless made with store=false",
                       param)
    return stored


async def _create(state: ServerState, body: ResponsesRequest, request: Request) -> Response:
    adapter = state.check_model(body.model)
    check_refused(body)
    history = () if body.previous_response_id is None else \
        _stored(state, body.previous_response_id, "previous_response_id").history
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else check_items(body.input)
    tools = check_tools(body.tools or [])
    system = [] if body.instructions is None else \
        [{"role": "system", "content": check_text(body.instructions, "instructions")}]
    turns = conversation([("previous_response_id", item) for item in history] +
                         [(f"input.{i}", item) for i, item in enumerate(items)])
    if not turns:
        raise APIError(400, "input: no message, function call or call output to answer", "input")
    chat = chat_request(body, system + turns, tools)
    calls = tool_request(chat)
    ids = await state.encode_chat_async(template_messages(chat.messages), template=template_arguments(chat, calls))
    shape = chat_shape(state, calls)
    state.check_context(len(ids), body.max_output_tokens, "input")
    max_tokens = state.max_seq_len - len(ids) if body.max_output_tokens is None else body.max_output_tokens
    structured = await answer_constraint(state, chat, shape, await requested_constraint(state, chat))
    params = sampling_params(chat, max_tokens, structured=structured, vocab_size=state.vocab_size,
                             defaults=state.built.sampling_defaults, lora=adapter)
    gen = Generation(state.engine, expand([ids], params, 1), "resp", stream=bool(body.stream))
    view = _ResponseView(state, body, tools, gen, shape, (*history, *items), len(ids))
    if body.stream:
        return event_stream(view.stream(), gen)
    choices = await gen.collect(request)
    return JSONResponse(view.whole(choices[0])) if choices is not None else client_gone(gen)


class _ResponseView:
    """One response's object, whole or as events, and its entry in the store."""

    def __init__(self, state: ServerState, body: ResponsesRequest, tools: list[FunctionToolSpec], gen: Generation,
                 shape: ChatShape, history: tuple[Item, ...], input_tokens: int) -> None:
        self.state, self.body, self.tools, self.gen, self.shape = state, body, tools, gen, shape
        self.history = history  # what a later previous_response_id continues, before this output
        self.input_tokens = input_tokens
        self.id = item_id("resp")

    def whole(self, choice: Choice) -> dict[str, Any]:
        message, _ = self.shape.message(choice.text, choice.finish_reason)
        status, reason = UNFINISHED.get(choice.finish_reason or "", ("completed", None))
        output = output_items(message, status == "completed")
        return self._finish(status, reason, output, choice.token_ids, choice.cached_tokens)

    async def stream(self) -> AsyncIterator[str]:
        events = OutputEvents()
        started = self._object("in_progress", None, [])
        yield "".join(events.event(kind, response=started) for kind in ("response.created", "response.in_progress"))
        answer = self.shape.stream()
        token_ids: list[int] = []
        async for _, out in self.gen.events():
            if out.error:
                error = {"code": "invalid_prompt" if out.client_error else "server_error",
                         "message": f"generation failed: {out.error}"}
                yield events.event("response.failed", response={**self._object("failed", None, events.items),
                                                                "error": error})
                return
            token_ids += [out.token_id] if out.token_id is not None else []
            sent = events.feed(answer.feed(out.text_delta) + (answer.close() if out.finished else []))
            if out.finished:
                status, reason = UNFINISHED.get(out.finish_reason or "", ("completed", None))
                sent += events.close(status == "completed")
                response = self._finish(status, reason, events.items, token_ids, out.cached_tokens)
                kind = "response.completed" if status == "completed" else "response.incomplete"
                sent.append(events.event(kind, response=response))
            yield "".join(sent)  # "" when the step's text is held back (see event_stream)

    def _finish(self, status: str, reason: str | None, output: list[dict[str, Any]], token_ids: list[int],
                cached_tokens: int) -> dict[str, Any]:
        """The final response object, stored unless store is false."""
        thought = self._reasoning_tokens(token_ids) if any(i["type"] == "reasoning" for i in output) else 0
        usage = {"input_tokens": self.input_tokens, "output_tokens": len(token_ids),
                 "total_tokens": self.input_tokens + len(token_ids),
                 "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": thought}}
        response = self._object(status, reason, output, usage)
        if self.body.store is not False:
            history = (*self.history, *check_items(output, "output"))
            self.state.responses.put(self.id, StoredResponse(response, history))
        return response

    def _reasoning_tokens(self, token_ids: list[int]) -> int:
        """The tokens up to and including </think> (Qwen 3's is one token), or all of them when it never came."""
        end = self.state.built.tokenizer.encode("</think>", add_special_tokens=False)
        return token_ids.index(end[0]) + 1 if len(end) == 1 and end[0] in token_ids else len(token_ids)

    def _object(self, status: str, reason: str | None, output: list[dict[str, Any]],
                usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body = self.body
        text = body.text.model_dump(by_alias=True, exclude_none=True) if body.text is not None else {}
        effort = body.reasoning.effort if body.reasoning is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.gen.created, "status": status,
            "background": False, "error": None,
            "incomplete_details": {"reason": reason} if reason is not None else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "max_tool_calls": None,
            "model": self.state.answered_by(body.model), "output": list(output),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": {"effort": effort, "summary": None},
            "store": body.store is not False, "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": {"type": "text"}, **text},
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
            "tools": [t.model_dump(exclude_none=True) for t in self.tools],
            "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": "disabled", "usage": usage,
            "user": body.user, "metadata": body.metadata or {},
        }
