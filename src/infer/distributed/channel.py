"""Step messages from rank 0 to every worker: bytes broadcast on the gloo control group.

A message travels in one broadcast of a fixed buffer when it fits (a decode step's does), in two when it does not:
the buffer holds the length, the first part, and the rest follows in a second broadcast of exactly its size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

CAPACITY = 16 * 1024  # bytes in the first broadcast, the 8-byte length included


class Channel:
    def __init__(self, group: Any) -> None:
        self.group = group
        self.src = dist.get_global_rank(group, 0)
        self.buffer = torch.zeros(CAPACITY, dtype=torch.uint8)
        self._view = self.buffer.numpy()

    def send(self, data: bytes) -> None:
        n = len(data)
        first = min(n, CAPACITY - 8)
        self._view[:8] = np.frombuffer(n.to_bytes(8, "little"), dtype=np.uint8)
        self._view[8 : 8 + first] = np.frombuffer(data, dtype=np.uint8, count=first)
        dist.broadcast(self.buffer, self.src, group=self.group)
        if n > first:
            dist.broadcast(torch.frombuffer(bytearray(data[first:]), dtype=torch.uint8), self.src, group=self.group)

    def recv(self) -> bytes:
        dist.broadcast(self.buffer, self.src, group=self.group)
        n = int.from_bytes(self._view[:8].tobytes(), "little")
        first = min(n, CAPACITY - 8)
        data = self._view[8 : 8 + first].tobytes()
        if n > first:
            rest = torch.empty(n - first, dtype=torch.uint8)
            dist.broadcast(rest, self.src, group=self.group)
            data += rest.numpy().tobytes()
        return data
