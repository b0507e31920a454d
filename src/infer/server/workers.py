"""Work that would hold the event loop for long runs on worker threads: tokenizing a large prompt, compiling a
grammar. Both are Rust (tokenizers, llguidance) and release the GIL while they work, and the threads run at the
lowest CPU priority (infer.background), so every other request's stream keeps flowing while one request waits
for its own.

Compiles are scheduled so that costly grammars cannot shut structured output off for everyone:
- a compile's time budget (`--structured-compile-timeout-s`) counts from when it starts running, never the time it
  queued; past it the request is answered 400 naming the field, and the compile runs on to its end and is cached
  (llguidance cannot be stopped), so the same constraint sent again is ready at once;
- a compile past its budget gives its slot back at once (up to MAX_ORPHANS such compiles run beside the pool);
- small constraints (spec up to SMALL_SPEC_CHARS) have a lane of their own: they never queue behind big ones;
- requests for a constraint already compiling wait for that compile rather than starting another;
- each lane queues at most MAX_WAITING compiles; past that a request is refused with CompileBusyError (503).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from infer.background import background_pool
from infer.structured import Constraint, GrammarCompiler

T = TypeVar("T")
TOKENIZE_THREADS = 2
COMPILE_THREADS = 2  # per lane
MAX_ORPHANS = 4  # compiles past their budget still running beside the pool
MAX_WAITING = 64  # compiles queued per lane
SMALL_SPEC_CHARS = 16_384  # a constraint this small compiles in milliseconds: it takes the small lane


class CompileTimeoutError(TimeoutError):
    """A constraint's grammar was not ready within the compile budget."""


class CompileBusyError(RuntimeError):
    """The compile queue is full (the server answers 503)."""


@dataclass
class CompileBudget:
    """The compile seconds one request may still spend (its compiles share them); queueing costs none."""

    left_s: float


@dataclass
class _Lane:
    slots: asyncio.Semaphore
    waiting: int = 0


@dataclass
class _Compiles:
    """The compile pool's shared state, on the server's event loop."""

    loop: asyncio.AbstractEventLoop
    lanes: dict[bool, _Lane]  # by "is small"
    running: dict[Constraint, asyncio.Future[None]] = field(default_factory=dict)
    orphaned: set[Constraint] = field(default_factory=set)  # running past their budget, their slot given back

    def lane(self, constraint: Constraint) -> _Lane:
        return self.lanes[len(constraint.spec) <= SMALL_SPEC_CHARS]


class Workers:
    """The API server's worker pools: one for tokenization, one for grammar compilation."""

    def __init__(self, compile_timeout_s: float) -> None:
        self.compile_timeout_s = compile_timeout_s
        self._tokenize = background_pool(TOKENIZE_THREADS, "infer-tokenize")
        self._compile = background_pool(2 * COMPILE_THREADS + MAX_ORPHANS, "infer-compile")
        self._compiles: _Compiles | None = None  # made on the event loop, at the first compile

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on a tokenization thread."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenize, fn, *args)

    async def compile(self, grammars: GrammarCompiler, constraint: Constraint, budget: CompileBudget | None = None
                      ) -> None:
        """Compile (and cache) `constraint` on a compile thread; ConstraintError as the compiler raises it,
        CompileTimeoutError past the budget (the compile timeout, or what is left of a request's shared `budget`,
        which this compile's running time is taken from), CompileBusyError when its lane's queue is full."""
        if grammars.is_cached(constraint):
            return
        budget = budget or CompileBudget(self.compile_timeout_s)
        if budget.left_s <= 0:
            raise self._timeout()
        loop = asyncio.get_running_loop()
        if self._compiles is None or self._compiles.loop is not loop:
            self._compiles = _Compiles(loop, {small: _Lane(asyncio.Semaphore(COMPILE_THREADS)) for small in (True, False)})
        compiles = self._compiles
        future = compiles.running.get(constraint)
        if future is None:
            lane = compiles.lane(constraint)
            if lane.waiting >= MAX_WAITING:
                raise CompileBusyError(f"the grammar compile queue is full ({MAX_WAITING} waiting); retry later")
            lane.waiting += 1
            try:
                await lane.slots.acquire()
            finally:
                lane.waiting -= 1
            if grammars.is_cached(constraint):  # compiled for another request while this one queued
                lane.slots.release()
                return
            future = compiles.running[constraint] = loop.run_in_executor(self._compile, grammars.compile, constraint)
            future.add_done_callback(lambda _: _finished(compiles, constraint))
        started = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(future), budget.left_s)
        except TimeoutError:
            _orphan(compiles, constraint)
            raise self._timeout() from None
        finally:
            budget.left_s -= time.monotonic() - started

    def _timeout(self) -> CompileTimeoutError:
        return CompileTimeoutError(f"its grammar did not compile within {self.compile_timeout_s:g} s "
                                   f"(--structured-compile-timeout-s)")

    def close(self) -> None:
        self._tokenize.shutdown(wait=False, cancel_futures=True)
        self._compile.shutdown(wait=False, cancel_futures=True)


def _finished(compiles: _Compiles, constraint: Constraint) -> None:
    """A compile ended: its slot is free again unless it gave it back when it ran past its budget."""
    future = compiles.running.pop(constraint)
    if constraint in compiles.orphaned:
        compiles.orphaned.remove(constraint)
    else:
        compiles.lane(constraint).slots.release()
    if not future.cancelled():
        future.exception()  # a late ConstraintError is nobody's to report


def _orphan(compiles: _Compiles, constraint: Constraint) -> None:
    """A compile past its budget runs on, cached when done; it frees its slot while few others do so."""
    future = compiles.running.get(constraint)
    if future is None or future.done() or constraint in compiles.orphaned or len(compiles.orphaned) >= MAX_ORPHANS:
        return
    compiles.orphaned.add(constraint)
    compiles.lane(constraint).slots.release()
