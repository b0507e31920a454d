"""Which Triton kernels compile while a block of code runs: what a first run pays that a warm one does not."""

from __future__ import annotations

import time
from typing import Any


class Compiles:
    """Context manager listing the Triton kernel variants compiled inside it (a variant not yet in this process's
    memory; Triton's disk cache may still serve it) as (kernel name, seconds). Not thread-safe: it patches
    `JITFunction._do_compile` for the whole process while active."""

    def __init__(self) -> None:
        self.kernels: list[tuple[str, float]] = []

    def __enter__(self) -> Compiles:
        from triton.runtime.jit import JITFunction

        self._original = original = JITFunction._do_compile
        kernels = self.kernels

        def timed(fn: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(fn, *args, **kwargs)
            finally:
                kernels.append((fn.__name__, time.perf_counter() - started))

        JITFunction._do_compile = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from triton.runtime.jit import JITFunction

        JITFunction._do_compile = self._original  # type: ignore[method-assign]
