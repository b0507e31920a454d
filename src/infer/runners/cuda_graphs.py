"""CUDA graphs: one graph per size bucket, captured at startup, replayed every step.

Decode: each graph runs the whole decode forward (input ids, every layer, final norm, LM head) on the
fixed buffers of DecodeBuffers and writes float32 logits to its own output tensor; a batch is padded to
the smallest bucket of rows that holds it. Prefill and mixed steps: each graph runs the model over a
token bucket and sequence slots of PrefillBuffers (runners/prefill_graphs.py). Above the largest bucket a step runs eagerly.
The graphs of a runner share one memory pool and are captured largest first, so they reuse the same
activations. Kernel selection (layerzero) runs once per bucket at capture time and never on the replay path.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

Key = TypeVar("Key", int, tuple[int, int])  # decode: rows; prefill: (tokens, sequence slots)
Out = TypeVar("Out")


@dataclass(frozen=True)
class GraphStats:
    batch_sizes: tuple  # the captured keys: rows (decode), or PrefillShape (tokens, sequence slots) for prefill
    capture_seconds: float
    # what the graphs hold: device memory (pool, outputs) measured around a CUDA capture; the kept tensors on the CPU
    memory_bytes: int


MAX_GRAPH_BATCH = 512  # above this, launch overhead is small next to the step and graphs only cost memory


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """Powers of two up to max_batch (at most MAX_GRAPH_BATCH), and max_batch itself when it fits under the cap."""
    top = min(max_batch, MAX_GRAPH_BATCH)
    sizes = [1 << i for i in range(top.bit_length()) if 1 << i <= top]
    return tuple(sorted({*sizes, top}))


def smallest_bucket(sizes: tuple[int, ...], rows: int) -> int | None:
    """The smallest of the ascending `sizes` holding `rows` sequences, or None (run eagerly)."""
    i = bisect.bisect_left(sizes, rows)
    return sizes[i] if i < len(sizes) else None


class CudaGraphs(Generic[Key, Out]):
    """Captured forwards keyed by padded size (decode: rows; prefill: (tokens, sequence slots)); `forward(size)`
    returns what a replay hands back (a tensor, or a tuple of them), in memory the graph owns."""

    def __init__(self, forward: Callable[[Key], Out], sizes: tuple[Key, ...], device: torch.device,
                 pool: tuple[int, int] | None = None, before: Callable[[Key], None] | None = None) -> None:
        """Capture `forward(size)` for each size, largest first, in `pool` (a new one when None); `before(size)`
        runs ahead of each size's warm-up, outside the capture (it may upload the inputs the graph reads)."""
        self.sizes = sizes
        self._graphs: dict[Key, tuple[torch.cuda.CUDAGraph, Out]] = {}
        torch.cuda.synchronize(device)
        gc.collect()
        torch.cuda.empty_cache()  # a capture empties the allocator's cache: do it first, or the memory it frees counts
        free_before = torch.cuda.mem_get_info(device)[0]
        started = time.perf_counter()
        pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        for size in sorted(sizes, reverse=True):
            if before is not None:
                before(size)
            forward(size)  # warm-up: Triton compiles and layerzero selects outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = forward(size)
            self._graphs[size] = (graph, out)
        torch.cuda.synchronize(device)
        self.stats = GraphStats(sizes, time.perf_counter() - started, free_before - torch.cuda.mem_get_info(device)[0])

    def bucket(self, rows: int) -> int | None:
        """Decode: the smallest captured size holding `rows` rows, or None (run eagerly)."""
        return smallest_bucket(self.sizes, rows)  # type: ignore[arg-type]

    def replay(self, size: Key) -> Out:
        """Run the graph for `size`; returns its outputs (decode: logits [size, vocab]), overwritten by the next
        replay."""
        graph, out = self._graphs[size]
        graph.replay()
        return out
