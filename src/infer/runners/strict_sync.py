"""INFER_STRICT_SYNC=1: any host synchronization inside a step raises instead of silently stalling the GPU.

torch's sync debug mode catches the implicit syncs (.item(), .tolist(), blocking copies, nonzero);
the guards catch the explicit ones it does not see (device, stream and event synchronize).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

ENV = "INFER_STRICT_SYNC"


class SyncInStepError(RuntimeError):
    """A host synchronization happened inside a step while INFER_STRICT_SYNC=1."""


def strict_sync_enabled() -> bool:
    return os.environ.get(ENV, "0") not in ("", "0", "false", "False")


def _guard(what: str):
    def refuse(*args: object, **kwargs: object) -> None:
        raise SyncInStepError(f"{what} inside a step ({ENV}=1): read results at the step boundary instead")

    return refuse


_GUARDED = (
    (torch.cuda, "synchronize", "torch.cuda.synchronize()"),
    (torch.cuda.Stream, "synchronize", "Stream.synchronize()"),
    (torch.cuda.Event, "synchronize", "Event.synchronize()"),
)


@contextlib.contextmanager
def step_scope(device: torch.device) -> Iterator[None]:
    """Inside: syncs raise when INFER_STRICT_SYNC=1 on CUDA; a no-op otherwise."""
    if device.type != "cuda" or not strict_sync_enabled():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _GUARDED]
    torch.cuda.set_sync_debug_mode("error")
    for owner, name, what in _GUARDED:
        setattr(owner, name, _guard(what))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
        torch.cuda.set_sync_debug_mode(previous)
