"""Grammar compilation off the engine core's step loop.

A request whose constraint is not compiled yet waits here, alone, while a worker thread compiles it (llguidance
releases the GIL and the thread runs at the lowest CPU priority, so the steps of every other request go on); once its grammar is cached the core loop admits it
to the scheduler, where making its matcher is a copy of microseconds. A compile past the budget
(`structured_compile_timeout_s`) or one that fails ends the request with a client error; an abort ends it at once.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

from infer.background import background_pool
from infer.wire import CoreRequest
from infer.structured import ConstraintError, GrammarCompiler

COMPILE_THREADS = 1  # one core's worth: the step loop keeps the others


@dataclass
class GrammarJob:
    """A request waiting for its grammar."""

    request: CoreRequest
    owner: bytes  # the API server that sent it
    future: Future[None]
    deadline: float


@dataclass
class Finished:
    """A job that left the queue: `error` is None when its grammar is ready to admit it."""

    job: GrammarJob
    error: str | None


class GrammarJobs:
    def __init__(self, compiler: GrammarCompiler, timeout_s: float) -> None:
        self.compiler = compiler
        self.timeout_s = timeout_s
        self._pool = background_pool(COMPILE_THREADS, "infer-core-compile")
        self._jobs: dict[str, GrammarJob] = {}

    @property
    def pending(self) -> bool:
        return bool(self._jobs)

    def needs_compile(self, request: CoreRequest) -> bool:
        constraint = request.params.structured
        return constraint is not None and not self.compiler.is_cached(constraint)

    def submit(self, request: CoreRequest, owner: bytes) -> None:
        future = self._pool.submit(self.compiler.compile, request.params.structured)
        self._jobs[request.request_id] = GrammarJob(request, owner, future, time.monotonic() + self.timeout_s)

    def cancel(self, request_id: str) -> GrammarJob | None:
        """Drop a waiting request (aborted); its compile finishes in the background and is cached."""
        return self._jobs.pop(request_id, None)

    def owned_by(self, owners: set[bytes]) -> list[str]:
        return [rid for rid, job in self._jobs.items() if job.owner in owners]

    def take_finished(self) -> list[Finished]:
        """Jobs whose compile ended (in arrival order) or whose budget ran out."""
        now, out = time.monotonic(), []
        for request_id, job in list(self._jobs.items()):
            if job.future.done():
                exc = job.future.exception()
                if exc is not None and not isinstance(exc, ConstraintError):
                    error = f"{type(exc).__name__}: {exc}"
                else:
                    error = None if exc is None else f"cannot compile the {job.request.params.structured.kind} " \
                                                     f"constraint: {exc}"
            elif now > job.deadline:
                error = (f"its grammar did not compile within {self.timeout_s:g} s "
                         f"(--structured-compile-timeout-s)")
            else:
                continue
            del self._jobs[request_id]
            out.append(Finished(job, error))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
