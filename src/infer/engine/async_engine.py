"""AsyncEngine: Engine.step() in one dedicated thread, outputs delivered to per-request asyncio queues.

Callers (the server's event loop) validate and submit from their own thread; the engine thread
takes submissions at the top of each iteration, so the scheduler's queues are only ever touched by
that one thread. Aborts go through Engine.abort, which is safe from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from infer.engine.engine import Engine
from infer.engine.metrics import ServingMetrics
from infer.engine.request import StepOutput
from infer.sampling.params import SamplingParams

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue holds max_waiting_requests requests already (the server answers 503)."""


@dataclass
class _Submission:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[StepOutput]
    submitted: float = field(default_factory=time.monotonic)
    last_token: float | None = None


class RequestStream:
    """The outputs of one request, in order; leaving the iteration early aborts the request."""

    def __init__(self, engine: AsyncEngine, sub: _Submission) -> None:
        self._engine = engine
        self._sub = sub
        self.finished = False

    @property
    def request_id(self) -> str:
        return self._sub.request_id

    async def __aiter__(self) -> AsyncIterator[StepOutput]:
        try:
            while not self.finished:
                out = await self._sub.queue.get()
                self.finished = out.finished
                yield out
        finally:
            if not self.finished:
                self._engine.abort(self.request_id)


class AsyncEngine:
    def __init__(self, engine: Engine, max_waiting_requests: int) -> None:
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.metrics = ServingMetrics()
        self._inbox: deque[_Submission] = deque()
        self._between_steps: deque[tuple[Callable[[], object], Future]] = deque()
        self._live: dict[str, _Submission] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infer-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        return len(self._inbox) + len(self.engine.scheduler.waiting)

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> RequestStream:
        """Queue a request; raises ValueError for a prompt the engine cannot run, QueueFullError when full."""
        self.engine.validate_prompt(prompt_token_ids)
        if self.num_waiting >= self.max_waiting_requests:
            raise QueueFullError(f"the waiting queue is full ({self.max_waiting_requests} requests); retry later")
        sub = _Submission(request_id, list(prompt_token_ids), params, asyncio.get_running_loop(), asyncio.Queue())
        self._inbox.append(sub)
        self._wake.set()
        return RequestStream(self, sub)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    def between_steps(self, call: Callable[[], object]) -> Future:
        """Run `call` on the engine thread between two steps (e.g. swapping probe weights); its result or
        exception comes back through the future."""
        future: Future = Future()
        self._between_steps.append((call, future))
        self._wake.set()
        return future

    # the engine thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take_submissions()
            self._run_between_steps()
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug, not a bad request: fail what is in flight, keep serving
                log.exception("engine step failed")
                outputs = self.engine.fail_all(f"{type(exc).__name__}: {exc}")
            self._deliver(outputs)

    def _take_submissions(self) -> None:
        while self._inbox:
            sub = self._inbox.popleft()
            try:
                self.engine.add_request(sub.prompt_token_ids, sub.params, request_id=sub.request_id)
            except ValueError as exc:
                self._deliver([StepOutput(sub.request_id, None, "", True, "error", str(exc))], sub)
                continue
            self._live[sub.request_id] = sub

    def _run_between_steps(self) -> None:
        while self._between_steps:
            call, future = self._between_steps.popleft()
            try:
                future.set_result(call())
            except Exception as exc:  # the caller decides; the engine keeps serving
                future.set_exception(exc)

    def _deliver(self, outputs: list[StepOutput], sub: _Submission | None = None) -> None:
        now = time.monotonic()
        for out in outputs:
            target = sub or self._live.get(out.request_id)
            if target is None:
                continue
            self.metrics.observe(out, now, target.submitted, target.last_token)
            if out.token_id is not None:
                target.last_token = now
            if out.finished:
                self._live.pop(out.request_id, None)
            try:
                target.loop.call_soon_threadsafe(target.queue.put_nowait, out)
            except RuntimeError:  # the caller's event loop is gone; nobody is listening
                self.abort(out.request_id)
