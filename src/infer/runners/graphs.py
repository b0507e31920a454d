"""Decode graphs for the device a runner is on: CUDA graphs on CUDA, recorded kernel calls on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from infer.runners.cpu_graphs import CpuDecodeGraphs
from infer.runners.cuda_graphs import DecodeGraphs

Graphs = DecodeGraphs | CpuDecodeGraphs


def decode_graphs(forward: Callable[[int], torch.Tensor], sizes: tuple[int, ...], device: torch.device,
                  model: nn.Module) -> Graphs:
    """Graphs of `forward` (`model`'s decode forward over fixed buffers, by padded batch size) for each size in
    `sizes`."""
    if device.type == "cuda":
        with torch.inference_mode():
            return DecodeGraphs(forward, sizes, device)
    if device.type == "cpu":
        return CpuDecodeGraphs(forward, sizes, model)
    raise ValueError(f"decode graphs need a CUDA device or the CPU; the model is on {device}")
