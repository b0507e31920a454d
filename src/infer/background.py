"""Thread pools for work that must yield the CPU to serving: tokenizing a large prompt, compiling a grammar.

Running such work on a thread keeps it off the event loop and the step loop, but on a machine with few cores it
still competes with the engine's own threads for the CPU: one busy tokenizer thread on 2 cores stalled a decode
stream for up to 1.8 s at a time. Each pool thread therefore runs at the lowest scheduling priority (Linux nice
19, set per thread): the engine keeps the cores, and the request that sent the large work waits alone.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

BACKGROUND_NICE = 19


def _lower_priority() -> None:
    """Give this thread the lowest CPU priority (Linux applies nice per thread; elsewhere a no-op)."""
    with contextlib.suppress(AttributeError, OSError):  # no per-thread nice on this platform, or not allowed
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


def background_pool(threads: int, name: str) -> ThreadPoolExecutor:
    """A pool whose threads run at the lowest CPU priority."""
    return ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=_lower_priority)
