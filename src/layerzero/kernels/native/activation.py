"""The native gated activations (SiLU and GeLU times up) for float32 on the CPU: one C call instead of a chunk,
an activation and a product."""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native.build import kernel

ARGS = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)
GELU = {"tanh": 1, "none": 2}


def _gated(x: torch.Tensor, act: int) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    inner = rows.shape[1] // 2
    out = torch.empty(rows.shape[0], inner, dtype=torch.float32)
    kernel("activation", "gated_activation", ARGS)(rows.data_ptr(), rows.shape[0], inner, act, out.data_ptr())
    return out.view(*x.shape[:-1], inner)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _gated(x, 0)


def gelu_and_mul(x: torch.Tensor, *, approximate: str) -> torch.Tensor:
    return _gated(x, GELU[approximate])
