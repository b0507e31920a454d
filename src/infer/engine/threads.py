"""Keep the main thread free of torch's CPU work when a server runs the engine on its own thread.

torch's CPU ops run on an OpenMP thread team owned by the OS thread that calls them. GNU OpenMP
spins its workers between parallel regions only while it manages no more threads than there are
CPUs; past that it parks them after ~100 spins, and every op then waits on a futex wake-up. A model
loaded on the main thread leaves the main thread's team alive, so the engine thread's team tips
the count over: on 2 cores that cost the server 25-35% of its decode speed (docs/engine.md). A
thread that exits takes its team with it, so the model is built on a short-lived thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def build_off_main_thread(build: Callable[[], T]) -> T:
    """Run `build` on a thread that exits when it returns; its result, or its exception re-raised here."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(build())
        except BaseException as exc:  # handed to the caller, who reports it
            error.append(exc)

    thread = threading.Thread(target=target, name="infer-load")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
