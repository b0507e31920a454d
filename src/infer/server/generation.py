"""Run a set of choices (prompts x n) through the engine client and merge their outputs in arrival order."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from infer.frontend.client import CoreGoneError, EngineClient, QueueFullError, RequestStream
from infer.wire import UnsendableRequest
from infer.frontend.outputs import ProbeScores, StepOutput, probe_columns
from infer.sampling.logprobs import TokenLogprob
from infer.sampling.params import SEED_LIMIT, SamplingParams
from infer.server.errors import APIError

log = logging.getLogger("infer.server")


@dataclass
class Job:
    """One choice to generate: which prompt it belongs to and how to sample it."""

    prompt_index: int
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class Choice:
    """A choice's outputs accumulated for a non-streaming response."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: str | None = None
    error: str | None = None
    client_error: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    probe_rows: list[ProbeScores] = field(default_factory=list)  # a token's scores per entry of token_ids
    prompt_probes: dict[str, list[float | None]] | None = None
    embedding: list[float] | None = None  # an embedding request's

    @property
    def probes(self) -> dict[str, list[float | None]]:
        """Per asked probe: a score per token."""
        return probe_columns(self.probe_rows)

    def add(self, out: StepOutput) -> None:
        self.text += out.text_delta
        if out.token_id is not None:
            self.token_ids.append(out.token_id)
        if out.logprob is not None:
            self.logprobs.append(out.logprob)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        if out.probes is not None:
            self.probe_rows.append(out.probes)
        if out.prompt_probes is not None:
            self.prompt_probes = out.prompt_probes
        if out.embedding is not None:
            self.embedding = out.embedding
        self.finish_reason = out.finish_reason or self.finish_reason
        self.error = out.error or self.error
        self.client_error = self.client_error or out.client_error
        self.prompt_tokens = out.prompt_tokens
        self.cached_tokens = out.cached_tokens


def expand(prompts: list[list[int]], params: SamplingParams, n: int) -> list[Job]:
    """prompts x n jobs, choice index = prompt * n + j; a seeded request's j-th choice uses seed + j."""
    jobs = []
    for p, ids in enumerate(prompts):
        for j in range(n):
            seed = None if params.seed is None else (params.seed + j) % SEED_LIMIT
            jobs.append(Job(p, ids, replace(params, seed=seed)))
    return jobs


class Generation:
    """Submits every job at once (all or nothing) and yields (choice index, output) as they come."""

    def __init__(self, engine: EngineClient, jobs: list[Job], prefix: str, probes: tuple[str, ...] = (),
                 stream: bool = True) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())  # every response and chunk of this request carries it
        self.engine = engine
        self.jobs = jobs
        self.streams: list[RequestStream] = []
        self._merged: asyncio.Queue[tuple[int, StepOutput]] | None = None  # n > 1: every choice's outputs, in order
        try:
            for i, job in enumerate(jobs):
                # a response sent whole reads only the final text: decoded once, not per token
                self.streams.append(engine.submit(f"{self.id}-{i}", job.prompt_ids, job.params, probes, stream))
            engine.flush()  # to the core now, not after the response is set up (~9 ms on a first request)
        except (QueueFullError, CoreGoneError) as exc:
            self.abort(engine)
            raise APIError(503, str(exc)) from exc
        except UnsendableRequest as exc:
            self.abort(engine)
            raise APIError(400, str(exc), exc.param) from exc
        except ValueError as exc:
            self.abort(engine)
            raise APIError(422, str(exc), "prompt") from exc

    def abort(self, engine: EngineClient) -> None:
        for stream in self.streams:
            engine.abort(stream.request_id)

    def has_queued(self) -> bool:
        """Outputs have arrived that `events()` has not yielded yet."""
        return self._merged is not None and not self._merged.empty() or len(self.streams) == 1 and self.streams[0].queued

    async def events(self) -> AsyncIterator[tuple[int, StepOutput]]:
        if len(self.streams) == 1:  # one choice: no merging task between its stream and the response
            outputs = self.streams[0].__aiter__()
            try:
                async for out in outputs:
                    yield 0, out
            finally:
                await outputs.aclose()  # leaving early aborts the request
            return
        merged = self._merged = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            async for out in stream:
                merged.put_nowait((index, out))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        remaining = len(tasks)
        try:
            while remaining:
                index, out = await merged.get()
                remaining -= out.finished
                yield index, out
        finally:
            for task in tasks:  # cancelling a pump leaves its stream early, which aborts the request
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def collect(self, request: Request) -> list[Choice] | None:
        """Every choice to the end; None when the client disconnected first (every choice is then aborted)."""
        choices = [Choice(i) for i in range(len(self.jobs))]

        async def gather() -> None:  # each choice's outputs once it ends: no wake-up per token
            for choice, outputs in zip(choices, await asyncio.gather(*(s.whole() for s in self.streams))):
                for out in outputs:
                    choice.add(out)

        work = asyncio.create_task(gather())
        watch = asyncio.create_task(_until_disconnected(request))
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        for task in (work, watch):
            task.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
        if work not in done:
            return None
        work.result()
        failed = next((c for c in choices if c.error), None)
        if failed is not None:
            status = 400 if failed.client_error else 500 if self.engine.alive else 503
            raise APIError(status, f"generation failed: {failed.error}")
        return choices


def event_stream(chunks: AsyncIterator[str], gen: Generation) -> StreamingResponse:
    """The SSE response of a streamed generation. While more outputs have already arrived, their events join the
    same write: under load one write (and one wake-up of the response) carries several steps' events, each
    still its own SSE event. `chunks` yields "" for an output it sends nothing for (text held back), so taking
    the queued outputs never waits for one that has not arrived while events are ready."""

    async def coalesced() -> AsyncIterator[str]:
        it = chunks.__aiter__()
        try:
            async for chunk in it:
                parts = [chunk]
                while gen.has_queued():
                    try:
                        parts.append(await anext(it))
                    except StopAsyncIteration:
                        break
                events = "".join(parts)
                if events:
                    yield events
        finally:
            await it.aclose()

    return StreamingResponse(coalesced(), media_type="text/event-stream")


def client_gone(gen: Generation) -> Response:
    """The answer to a client that left before its non-streamed response: one info line, nothing to send."""
    log.info("client disconnected; %s aborted", gen.id)
    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


async def _until_disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.2)


def probe_fields(names: tuple[str, ...], probes: dict[str, list[float | None]] | None,
                 prompt_probes: dict[str, list[float | None]] | None, with_prompt: bool) -> dict[str, object]:
    """A choice's (or chunk's) `probes` and `prompt_probes`: every requested name present, even with no tokens."""
    if not names:
        return {}
    fields: dict[str, object] = {"probes": {name: (probes or {}).get(name, []) for name in names}}
    if with_prompt and prompt_probes is not None:
        fields["prompt_probes"] = {name: prompt_probes.get(name, []) for name in names}
    return fields


def chunk_probes(names: tuple[str, ...], out: StepOutput, with_prompt: bool) -> dict[str, object]:
    """A stream chunk's probe fields: the scores of the tokens in this chunk (and the prompt's, on the first)."""
    if not names:
        return {}
    probes = {name: [value] for name, value in out.probes.items()} if out.probes is not None else {}
    return probe_fields(names, probes, out.prompt_probes, with_prompt)
