"""Decode graphs for the device a runner is on: CUDA graphs on CUDA, recorded kernel calls on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from infer.runners.cpu_graphs import CpuDecodeGraphs
from infer.runners.cuda_graphs import CudaGraphs

Graphs = CudaGraphs[int, torch.Tensor] | CpuDecodeGraphs

# CUDA decode graphs of the smallest batches are captured again for each bound in SHORT_CONTEXTS that at most halves
# the capacity, and a step replays the smallest bound its longest context fits. The decode attention cuts each
# sequence's keys into a split count fixed by the bound it was captured with, so a short context replayed in a long
# capacity's graph launches mostly empty splits (docs/gpu.md). The CPU attention reads only the keys a sequence has,
# whatever its bound: no second set there.
SHORT_CONTEXTS = (256, 2048)
# above this many rows the split count hardly follows the bound (8 rows of 4+ KV heads split at most 9 ways)
SHORT_CONTEXT_ROWS = 4


def decode_graphs(forward: Callable[[int], torch.Tensor], sizes: tuple[int, ...], device: torch.device,
                  model: nn.Module, pool: tuple[int, int] | None = None,
                  pad: Callable[[int], None] | None = None) -> Graphs:
    """Graphs of `forward` (`model`'s decode forward over fixed buffers, by padded batch size) for each size in
    `sizes`; on CUDA in `pool` when given (the runner's prefill graphs share it), `pad(size)` making the buffers
    all padding before a size's warm-up and capture run the forward (the CPU records a step's real inputs)."""
    if device.type == "cuda":
        with torch.inference_mode():
            return CudaGraphs(forward, sizes, device, pool, pad)
    if device.type == "cpu":
        return CpuDecodeGraphs(forward, sizes, model)
    raise ValueError(f"decode graphs need a CUDA device or the CPU; the model is on {device}")


def short_bounds(capacity: int) -> tuple[int, ...]:
    """The short-context bounds worth a graph set under a capacity of `capacity` keys: those that at most halve it."""
    return tuple(b for b in SHORT_CONTEXTS if 2 * b <= capacity)
