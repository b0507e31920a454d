"""The native gated activations (SiLU and GeLU times up) on the CPU: one C call instead of a chunk, an activation and
a product. float32 rows, or bfloat16 rows computed in float32 and rounded once (a CPU bf16 model's gate_up GEMM output
straight into its down GEMM's input, no float32 round trip: docs/engine.md, "bfloat16 on the CPU")."""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native.build import kernel

ARGS = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)
GELU = {"tanh": 1, "none": 2}
SYMBOLS = {torch.float32: "gated_activation", torch.bfloat16: "gated_activation_bf16"}


def _gated(x: torch.Tensor, act: int, extra: tuple[str, ...] = ()) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    inner = rows.shape[1] // 2
    out = torch.empty(rows.shape[0], inner, dtype=rows.dtype)
    kernel("activation", SYMBOLS[rows.dtype], ARGS, None, extra)(rows.data_ptr(), rows.shape[0], inner, act,
                                                                  out.data_ptr())
    return out.view(*x.shape[:-1], inner)


def silu_and_mul(x: torch.Tensor, *, _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """`_extra`: compiler flags of another build (tests: the AVX2 and plain-C forms)."""
    return _gated(x, 0, _extra)


def gelu_and_mul(x: torch.Tensor, *, approximate: str, _extra: tuple[str, ...] = ()) -> torch.Tensor:
    return _gated(x, GELU[approximate], _extra)
