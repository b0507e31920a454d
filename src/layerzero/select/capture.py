"""Whether a CUDA graph is being captured on a device: read per call by the context and the dispatch keys."""

from __future__ import annotations

from functools import cache

import torch


@cache
def cuda_available() -> bool:
    """Whether this torch build sees a CUDA device (asked once)."""
    return torch.cuda.is_available()


def is_capturing(device: torch.device | str | int | None = None) -> bool:
    """Whether the current stream of `device` (default: the current CUDA device) is capturing a CUDA graph.

    False on CPU-only builds, for non-CUDA devices, and whenever CUDA cannot be queried; never raises.
    """
    if not cuda_available():
        return False
    try:
        if device is not None:
            device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            if device.type != "cuda":
                return False
            if device.index is not None and device.index != torch.cuda.current_device():
                with torch.cuda.device(device.index):
                    return torch.cuda.is_current_stream_capturing()
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError, AttributeError):
        return False
