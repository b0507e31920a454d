"""The native RMSNorm (and its fused residual add) on the CPU: one C call per norm instead of the half dozen aten ops
torch runs for a small row. float32; and the add of bfloat16 rows to a float32 residual with the normed rows written
in bfloat16 (a CPU bf16 model's projection output in, its next GEMM's input out: docs/engine.md, "bfloat16 on the
CPU")."""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native.build import kernel

_P, _F, _I64 = ctypes.c_void_p, ctypes.c_float, ctypes.c_int64
ARGS = (_P, _P, _P, _P, _F, _F, _I64, _I64, _P)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, *, eps: float, weight_offset: float) -> torch.Tensor:
    rows, w = _rows(x), weight.float().contiguous()
    out = torch.empty_like(rows)
    kernel("norm", "rms_norm", ARGS)(rows.data_ptr(), None, None, w.data_ptr(), weight_offset, eps,
                                      rows.shape[0], rows.shape[1], out.data_ptr())
    return out.view(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, eps: float,
                       weight_offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), both new tensors: float32, or for bf16 x and a float32 residual the sum in
    float32 and the norm in bf16."""
    rows, res, w = _rows(x), _rows(residual), weight.float().contiguous()
    out, summed = torch.empty_like(rows), torch.empty_like(res)
    symbol = "add_rms_norm_bf16" if rows.dtype == torch.bfloat16 else "rms_norm"
    kernel("norm", symbol, ARGS)(rows.data_ptr(), res.data_ptr(), summed.data_ptr(), w.data_ptr(), weight_offset,
                                  eps, rows.shape[0], rows.shape[1], out.data_ptr())
    return out.view(x.shape), summed.view(x.shape)
