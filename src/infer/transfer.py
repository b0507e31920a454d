"""Host <-> device transfers that never block the host: pinned uploads and a pinned read-back slot."""

from __future__ import annotations

import numpy as np
import torch


def upload(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor; on CUDA through pinned memory, so the copy is asynchronous."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


ALIGN = 16


def aligned(nbytes: int) -> int:
    """`nbytes` rounded up to ALIGN: where the next array of a shared byte buffer may start."""
    return -(-nbytes // ALIGN) * ALIGN


class StagedUpload:
    """Several host arrays to the device in one asynchronous copy through pinned staging memory.

    Two staging buffers alternate, so one is rewritten only once the step that used the other has been
    read back: with at most one step in flight, a queued copy never sees its source change. Call it once
    per step. On the CPU the arrays are copied into fresh memory (the staging is reused).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned = device.type == "cuda"
        self._staging = [torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)]
        self._next = 0

    def __call__(self, *arrays: np.ndarray, into: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Device tensors with the arrays' dtypes and shapes, in order: views of fresh device memory, or of the
        device byte buffer `into` (the same arrays' shapes then give the same addresses every call: what a
        captured graph reads)."""
        offsets, end = [], 0
        for a in arrays:
            offsets.append(end)
            # every array starts 16-byte aligned: Triton specializes a pointer on it, so a misaligned view would
            # compile a kernel anew in the middle of serving (and lose its vector loads)
            end += aligned(a.nbytes)
        staging = self._staging[self._next]
        if staging.numel() < end:
            staging = torch.empty(max(end, 2 * staging.numel()), dtype=torch.uint8, pin_memory=self._pinned)
            self._staging[self._next] = staging
        self._next ^= 1
        host = staging.numpy()
        for a, offset in zip(arrays, offsets):
            host[offset : offset + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        used = staging[:end]
        if into is not None:
            if into.numel() < end:
                raise ValueError(f"an upload of {end} bytes does not fit the {into.numel()}-byte device buffer")
            raw = into[:end]
            raw.copy_(used, non_blocking=self._pinned)
        else:
            raw = used.to(self.device, non_blocking=True) if self._pinned else used.clone()
        return [
            raw[offset : offset + a.nbytes].view(_TORCH_DTYPES[a.dtype]).view(a.shape) for a, offset in zip(arrays, offsets)
        ]


_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.float32): torch.float32}


class Readback:
    """Sampled ids (and, when asked, probe score rows) copied to pinned host memory after the step; read once at
    the step boundary.

    On CUDA the copies run on a stream of their own, ordered after the step's sampling: the next step's input upload
    and graph, queued behind the sampling on the main stream, do not wait for them (a decode step's boundary is
    shorter by the copy and its gap). The copied tensors stay referenced until `read()`, so the allocator cannot
    hand their memory to the next step while a copy may still read it."""

    def __init__(self, device: torch.device, max_rows: int, score_shape: tuple[int, int] | None = None) -> None:
        self.cuda = device.type == "cuda"
        self.host = torch.empty(max_rows, dtype=torch.int64, pin_memory=self.cuda)
        self.scores_host = torch.empty(score_shape, dtype=torch.float32, pin_memory=self.cuda) if score_shape else None
        self.event = torch.cuda.Event() if self.cuda else None
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.rows = 0
        self.score_rows: int | None = None  # rows of scores queued with the ids (None: none this step)
        self._sources: tuple[torch.Tensor, torch.Tensor | None] | None = None  # what the copies read, until read()

    def start(self, token_ids: torch.Tensor, scores: torch.Tensor | None = None) -> None:
        """Queue the copies (no sync); the caller must read() before reusing this slot."""
        self.rows = token_ids.shape[0]
        self.score_rows = None
        if self.stream is None or self.event is None:
            self._copy(token_ids, scores)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        self._sources = (token_ids, scores)
        with torch.cuda.stream(self.stream):
            self._copy(token_ids, scores)
            self.event.record(self.stream)

    def _copy(self, token_ids: torch.Tensor, scores: torch.Tensor | None) -> None:
        self.host[: self.rows].copy_(token_ids, non_blocking=self.cuda)
        if scores is not None and self.scores_host is not None:
            self.score_rows = scores.shape[0]
            self.scores_host[: self.score_rows].copy_(scores, non_blocking=self.cuda)

    def read(self) -> list[int]:
        """Wait for the copies (the step's one host sync) and return the ids."""
        if self.event is not None:
            self.event.synchronize()
        self._sources = None
        return self.host[: self.rows].tolist()

    def read_scores(self) -> np.ndarray | None:
        """The score rows queued with the ids (call after read()); a copy, since the slot is reused."""
        if self.score_rows is None or self.scores_host is None:
            return None
        return self.scores_host[: self.score_rows].numpy().copy()
