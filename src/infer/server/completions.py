"""POST /v1/completions: prompts (text or token ids, one or many) x n choices, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from infer.sampling.logprobs import TokenLogprob
from infer.server.errors import APIError
from infer.server.generation import Choice, Generation, chunk_probes, client_gone, event_stream, expand, probe_fields
from infer.server.openapi import GENERATION_RESPONSES
from infer.server.protocol import CompletionRequest
from infer.server.responses import completion_logprobs, envelope, sse, stream_error, usage
from infer.server.probes import requested_probes
from infer.server.sampling import check_supported, sampling_params
from infer.server.state import ServerState
from infer.server.structured import requested_constraint

router = APIRouter()
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


async def prompt_ids(state: ServerState, prompt: str | list, field: str = "prompt"
                     ) -> tuple[list[list[int]], list[str | None]]:
    """Every prompt as token ids (each id checked against the vocabulary), plus its text when it came as text;
    errors name `field` (and the prompt's index)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompt = [prompt]
    if not prompt:
        raise APIError(422, f"{field} must not be empty", field)
    params = [field if len(prompt) == 1 else f"{field}.{i}" for i in range(len(prompt))]
    texts = [(p, param) for p, param in zip(prompt, params) if isinstance(p, str)]
    # the batch's text is tokenized in one go, on a worker thread once it is large in all (not prompt by prompt)
    encoded = iter(await state.encode_many_async(texts))
    ids = []
    for p, param in zip(prompt, params):
        if isinstance(p, str):
            ids.append(next(encoded))
        else:
            state.check_token_ids(p, param)
            ids.append(list(p))
    return ids, [p if isinstance(p, str) else None for p in prompt]


@router.post("/v1/completions", responses=GENERATION_RESPONSES)
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.infer
    adapter = state.check_model(body.model)
    check_supported(body)
    prompts, texts = await prompt_ids(state, body.prompt)
    state.check_parts(len(prompts) * body.n)
    for ids in prompts:
        state.check_context(len(ids), body.max_tokens, "prompt")
    # without max_tokens, OpenAI's default of 16; the engine also stops at the end of the context
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    prompt_lp = body.logprobs if body.echo else None
    params = sampling_params(body, max_tokens, logprobs=body.logprobs, prompt_logprobs=prompt_lp,
                             structured=await requested_constraint(state, body), vocab_size=state.vocab_size,
                             defaults=state.built.sampling_defaults, lora=adapter)
    probes = requested_probes(state, params)
    echoes = [(t if t is not None else state.decode(ids, skip_special_tokens=False)) if body.echo else "" for ids, t in zip(prompts, texts)]
    gen = Generation(state.engine, expand(prompts, params, body.n), "cmpl", probes, body.stream)
    view = _CompletionView(state, body, prompts, echoes, gen, probes)
    if body.stream:
        return event_stream(view.stream(), gen)
    choices = await gen.collect(request)
    return JSONResponse(view.response(choices)) if choices is not None else client_gone(gen)


class _CompletionView:
    """Formats one completion request's outputs, whole or as chunks."""

    def __init__(self, state: ServerState, body: CompletionRequest, prompts: list[list[int]], echoes: list[str],
                 gen: Generation, probes: tuple[str, ...]) -> None:
        self.state, self.body, self.prompts, self.echoes, self.gen = state, body, prompts, echoes, gen
        self.probes = probes  # the probe names each choice carries scores of

    def _prompt(self, choice: int) -> int:
        return self.gen.jobs[choice].prompt_index

    def _logprobs(self, choice: int, prompt_lps: list[TokenLogprob | None] | None, lps: list[TokenLogprob],
                  offset: int) -> dict[str, list] | None:
        if self.body.logprobs is None:
            return None
        entries: list[tuple[int, TokenLogprob | None]] = []
        if prompt_lps is not None:
            entries += list(zip(self.prompts[self._prompt(choice)], prompt_lps))
        entries += [(lp.token_id, lp) for lp in lps]
        return completion_logprobs(entries, self.state.token_text, offset)

    def _usage(self, completion_tokens: int, cached: dict[int, int]) -> dict[str, object]:
        """cached: prompt index -> its cached tokens (the n choices of a prompt share it)."""
        return usage(sum(len(p) for p in self.prompts), completion_tokens, sum(cached.values()))

    def _note_cached(self, cached: dict[int, int], choice: int, tokens: int) -> None:
        prompt = self._prompt(choice)
        cached[prompt] = max(cached.get(prompt, 0), tokens)

    def response(self, choices: list[Choice]) -> dict[str, object]:
        body = []
        for c in choices:
            echo = self.echoes[self._prompt(c.index)]
            body.append({"index": c.index, "text": echo + c.text, "finish_reason": c.finish_reason,
                         "logprobs": self._logprobs(c.index, c.prompt_logprobs, c.logprobs, 0),
                         **probe_fields(self.probes, c.probes, c.prompt_probes, self.body.probe_prompt)})
        completion = sum(len(c.token_ids) for c in choices)
        cached: dict[int, int] = {}
        for c in choices:
            self._note_cached(cached, c.index, c.cached_tokens)
        return envelope("text_completion", self.gen.id, self.gen.created, self.state.answered_by(self.body.model), body,
                        usage=self._usage(completion, cached))

    async def stream(self) -> AsyncIterator[str]:
        offsets = [0] * len(self.gen.jobs)
        started = [False] * len(self.gen.jobs)
        completion, cached = 0, {}
        so_far: dict[int, int] = {}  # choice -> its completion tokens so far (continuous_usage_stats)
        async for index, out in self.gen.events():
            if out.error:
                yield stream_error(out.error, out.client_error)
                return
            text = out.text_delta
            prompt_lps = out.prompt_logprobs
            if not started[index]:
                started[index] = True
                text = self.echoes[self._prompt(index)] + text
            lps = [out.logprob] if out.logprob is not None else []
            if not (text or out.finished or lps or prompt_lps or out.probes is not None):
                yield ""  # text held back (an incomplete character, a possible stop string; see event_stream)
                continue
            logprobs = self._logprobs(index, prompt_lps, lps, offsets[index])
            if logprobs is not None:
                offsets[index] += sum(map(len, logprobs["tokens"]))
            completion += out.completion_tokens if out.finished else 0
            self._note_cached(cached, index, out.cached_tokens)
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": out.finish_reason if out.finished else None,
                      **chunk_probes(self.probes, out, self.body.probe_prompt)}
            so_far[index] = out.completion_tokens
            extra = {"usage": self._usage(sum(so_far.values()), cached)} if self.body.continuous_usage else {}
            yield sse(envelope("text_completion", self.gen.id, self.gen.created, self.state.answered_by(self.body.model), [choice], **extra))
        if self.body.include_usage:
            yield sse(envelope("text_completion", self.gen.id, self.gen.created, self.state.answered_by(self.body.model), [],
                               usage=self._usage(completion, cached)))
        yield sse("[DONE]")
