"""Work that would hold the event loop for long runs on worker threads: tokenizing a large prompt, compiling a
grammar. Both are Rust (tokenizers, llguidance) and release the GIL while they work, and the threads run at the
lowest CPU priority (infer.background), so every other request's stream keeps flowing while one request waits
for its own.

Compiles have their own pool and a time budget (`--structured-compile-timeout-s`): a request whose grammar is not
ready in time is answered 400 naming the field; the compile runs on to its end and is cached, so the same
constraint sent again is ready at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from infer.background import background_pool
from infer.structured import Constraint, GrammarCompiler

T = TypeVar("T")
TOKENIZE_THREADS = 2
COMPILE_THREADS = 2


class CompileTimeoutError(TimeoutError):
    """A constraint's grammar was not ready within the compile budget."""


class Workers:
    """The API server's worker pools: one for tokenization, one for grammar compilation."""

    def __init__(self, compile_timeout_s: float) -> None:
        self.compile_timeout_s = compile_timeout_s
        self._tokenize = background_pool(TOKENIZE_THREADS, "infer-tokenize")
        self._compile = background_pool(COMPILE_THREADS, "infer-compile")

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on a tokenization thread."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenize, fn, *args)

    async def compile(self, grammars: GrammarCompiler, constraint: Constraint, deadline: float | None = None) -> None:
        """Compile (and cache) `constraint` on a compile thread; ConstraintError as the compiler raises it,
        CompileTimeoutError past the budget: the compile timeout, or what is left of it at `deadline` (the loop's
        clock) when a request's compiles share one budget."""
        if grammars.is_cached(constraint):
            return
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._compile, grammars.compile, constraint)
        budget = self.compile_timeout_s if deadline is None else max(0.0, deadline - loop.time())
        try:
            await asyncio.wait_for(asyncio.shield(future), budget)
        except TimeoutError:
            future.add_done_callback(_consume)  # it finishes in the background and is cached; nobody waits
            raise CompileTimeoutError(f"its grammar did not compile within {self.compile_timeout_s:g} s "
                                      f"(--structured-compile-timeout-s)") from None

    def close(self) -> None:
        self._tokenize.shutdown(wait=False, cancel_futures=True)
        self._compile.shutdown(wait=False, cancel_futures=True)


def _consume(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a late ConstraintError is nobody's to report
