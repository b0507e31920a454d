"""What `infer serve`'s supervising process prints for its user: one `[infer]` line per event, on stderr."""

from __future__ import annotations

import signal
import sys


def say(message: str) -> None:
    print(f"[infer] {message}", file=sys.stderr, flush=True)


def ended(exitcode: int | None) -> str:
    """How a child process ended, in words."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else str(-exitcode)
        return f"was killed by signal {name}"
    return f"exited with code {exitcode}"
