"""Host <-> device transfers that never block the host: pinned uploads and a pinned read-back slot."""

from __future__ import annotations

import torch


def upload(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor; on CUDA through pinned memory, so the copy is asynchronous."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class Readback:
    """Sampled ids copied to pinned host memory inside the step; read once at the step boundary."""

    def __init__(self, device: torch.device, max_rows: int) -> None:
        self.cuda = device.type == "cuda"
        self.host = torch.empty(max_rows, dtype=torch.int64, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None
        self.rows = 0

    def start(self, token_ids: torch.Tensor) -> None:
        """Queue the copy (no sync); the caller must read() before reusing this slot."""
        self.rows = token_ids.shape[0]
        self.host[: self.rows].copy_(token_ids, non_blocking=self.cuda)
        if self.event is not None:
            self.event.record()

    def read(self) -> list[int]:
        """Wait for the copy (the step's one host sync) and return the ids."""
        if self.event is not None:
            self.event.synchronize()
        return self.host[: self.rows].tolist()
