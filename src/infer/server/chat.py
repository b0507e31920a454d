"""POST /v1/chat/completions: a conversation rendered through our chat template, streamed as deltas or whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from infer.sampling.logprobs import TokenLogprob
from infer.server.chat_output import ChatShape
from infer.server.chat_request import answer_constraint, chat_shape, template_arguments
from infer.server.errors import APIError
from infer.server.generation import Choice, Generation, chunk_probes, client_gone, event_stream, expand, probe_fields
from infer.server.openapi import GENERATION_RESPONSES
from infer.server.protocol import ChatCompletionRequest
from infer.server.responses import chat_logprobs, envelope, sse, stream_error, usage
from infer.server.probes import requested_probes
from infer.server.sampling import check_supported, sampling_params
from infer.server.state import ServerState
from infer.server.structured import requested_constraint
from infer.server.tools import template_messages as plain_messages
from infer.server.tools import tool_request

router = APIRouter()


@router.post("/v1/chat/completions", responses=GENERATION_RESPONSES)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.infer
    adapter = state.check_model(body.model)
    check_supported(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(422, "top_logprobs requires logprobs=true", "top_logprobs")
    state.check_parts(body.n)
    tools = tool_request(body)
    ids = await state.encode_chat_async(plain_messages(body.messages), template=template_arguments(body, tools))
    shape = chat_shape(state, tools)
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    state.check_context(len(ids), limit, "messages")
    max_tokens = state.max_seq_len - len(ids) if limit is None else limit  # no limit: the rest of the context
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    structured = await answer_constraint(state, body, shape, await requested_constraint(state, body))
    params = sampling_params(body, max_tokens, logprobs=logprobs, structured=structured, vocab_size=state.vocab_size,
                             defaults=state.built.sampling_defaults, lora=adapter)
    probes = requested_probes(state, params)
    gen = Generation(state.engine, expand([ids], params, body.n), "chatcmpl", probes, body.stream)
    view = _ChatView(state, body, len(ids), gen, probes, shape)
    if body.stream:
        return event_stream(view.stream(), gen)
    choices = await gen.collect(request)
    return JSONResponse(view.response(choices)) if choices is not None else client_gone(gen)


class _ChatView:
    def __init__(self, state: ServerState, body: ChatCompletionRequest, prompt_tokens: int, gen: Generation,
                 probes: tuple[str, ...], shape: ChatShape) -> None:
        self.state, self.body, self.prompt_tokens, self.gen = state, body, prompt_tokens, gen
        self.probes = probes  # the probe names each choice carries scores of
        self.shape = shape  # reasoning and tool calls taken out of the text

    def _envelope(self, kind: str, choices: list, **extra: object) -> dict[str, object]:
        return envelope(kind, self.gen.id, self.gen.created, self.state.answered_by(self.body.model), choices, **extra)

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, object] | None:
        return chat_logprobs(entries, self.state.token_text, self.state.token_bytes) if self.body.logprobs else None

    def response(self, choices: list[Choice]) -> dict[str, object]:
        body = []
        for c in choices:
            message, finish_reason = self.shape.message(c.text, c.finish_reason)
            body.append({"index": c.index, "finish_reason": finish_reason, "message": message,
                         "logprobs": self._logprobs(c.logprobs),
                         **probe_fields(self.probes, c.probes, c.prompt_probes, self.body.probe_prompt)})
        completion = sum(len(c.token_ids) for c in choices)
        cached = max(c.cached_tokens for c in choices)  # the n choices share one prompt
        return self._envelope("chat.completion", body, usage=usage(self.prompt_tokens, completion, cached))

    async def stream(self) -> AsyncIterator[str]:
        for index in range(len(self.gen.jobs)):
            delta = {"role": "assistant", "content": ""}
            extra = {"usage": usage(self.prompt_tokens, 0)} if self.body.continuous_usage else {}
            yield sse(self._envelope("chat.completion.chunk", [{"index": index, "delta": delta, "finish_reason": None,
                                                                **probe_fields(self.probes, None, None, False)}], **extra))
        completion = cached = 0
        so_far: dict[int, int] = {}  # choice -> its completion tokens so far (continuous_usage_stats)
        streams = [self.shape.stream() for _ in self.gen.jobs]
        async for index, out in self.gen.events():
            if out.error:
                yield stream_error(out.error, out.client_error)
                return
            lps = [out.logprob] if out.logprob is not None else []
            deltas = streams[index].feed(out.text_delta) + (streams[index].close() if out.finished else [])
            if not (deltas or out.finished or lps or out.probes is not None):
                yield ""  # held back (a tool call, a possible stop string): nothing to send (see event_stream)
                continue
            completion += out.completion_tokens if out.finished else 0
            cached = max(cached, out.cached_tokens)
            so_far[index] = out.completion_tokens
            extra = {"usage": usage(self.prompt_tokens, sum(so_far.values()), cached)} if self.body.continuous_usage else {}
            for delta in deltas[:-1]:  # a step's text may hold several deltas (a call: its name, then its arguments)
                yield sse(self._envelope("chat.completion.chunk", [{"index": index, "delta": delta, "logprobs": None,
                                                                    "finish_reason": None}], **extra))
            choice = {"index": index, "delta": deltas[-1] if deltas else {},
                      "logprobs": self._logprobs(lps),
                      "finish_reason": streams[index].finish_reason(out.finish_reason) if out.finished else None,
                      **chunk_probes(self.probes, out, self.body.probe_prompt)}
            yield sse(self._envelope("chat.completion.chunk", [choice], **extra))
        if self.body.include_usage:
            yield sse(self._envelope("chat.completion.chunk", [], usage=usage(self.prompt_tokens, completion, cached)))
        yield sse("[DONE]")
