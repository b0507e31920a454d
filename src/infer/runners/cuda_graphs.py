"""CUDA graphs for decode: one graph per batch-size bucket, captured at startup, replayed every step.

Each graph runs the whole decode forward (input ids, every layer, final norm, LM head) on the fixed
buffers of DecodeBuffers and writes float32 logits to its own output tensor. A batch is padded to the
smallest bucket that holds it; above the largest bucket decode runs eagerly on the same buffers.
All graphs share one memory pool and are captured largest first, so they reuse the same activations.
Kernel selection (layerzero) runs once per bucket at capture time and never on the replay path.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GraphStats:
    batch_sizes: tuple[int, ...]
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


class DecodeGraphs:
    """Captured decode forwards keyed by padded batch size."""

    def __init__(self, forward: Callable[[int], torch.Tensor], sizes: tuple[int, ...], device: torch.device) -> None:
        self.sizes = sizes
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        torch.cuda.synchronize(device)
        free_before = torch.cuda.mem_get_info(device)[0]
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in sorted(sizes, reverse=True):
            forward(size)  # warm-up: Triton compiles and layerzero selects outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = forward(size)
            self._graphs[size] = (graph, logits)
        torch.cuda.synchronize(device)
        self.stats = GraphStats(sizes, time.perf_counter() - started, free_before - torch.cuda.mem_get_info(device)[0])

    def bucket(self, rows: int) -> int | None:
        """The smallest captured size holding `rows` sequences, or None (run eagerly)."""
        return smallest_bucket(self.sizes, rows)

    def replay(self, size: int) -> torch.Tensor:
        """Run the graph for `size` rows; returns its logits [size, vocab] (overwritten by the next replay)."""
        graph, logits = self._graphs[size]
        graph.replay()
        return logits
