"""The float32 GEMM for AVX2 CPUs (`f32_gemm.c`): a float32 (or, widened, bfloat16) model's projections past the
GEMV's rows, a prefill's and a large decode batch's.

On a Zen 4 with AVX2 only (AVX-512 hidden), oneDNN's float32 GEMM ran SmolLM2-135M's four projections at ~66
GFLOP/s a core; this one's 6 x 16 register block runs them 1.05-1.32x faster at 17-1,920 rows, a whole 128-token
prefill 1.11x (benchmarks/reports/cpu_f32_gemm.md). Each weight is packed once into panels of 16 output columns (a
bfloat16 one widened exactly, as oneDNN's float32 copy of it is on such a CPU); a row's result does not depend on
what else shares the call.
"""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native.build import kernel
from layerzero.kernels.native.linear import float_rows, shaped
from layerzero.kernels.weight_cache import WeightCache

COLS = 16  # outputs per packed panel: N is padded to a multiple in the packed copy

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
PACK_ARGS = (_P, _I64, _I64, ctypes.c_int, _P)
ARGS = (_P, _I64, _I64, _P, _I64, _P, _P, ctypes.c_int)

PACKED: WeightCache[torch.Tensor] = WeightCache()  # each weight as float32 panels of 16 outputs


def _pack(weight: torch.Tensor) -> torch.Tensor:
    n, k = weight.shape
    w = weight.detach().contiguous()
    packed = torch.empty(-(-n // COLS) * COLS * k, dtype=torch.float32)
    kernel("f32_gemm", "f32_gemm_pack", PACK_ARGS)(w.data_ptr(), n, k, int(w.dtype == torch.bfloat16),
                                                   packed.data_ptr())
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] float32 @ weight[N, K].T + bias for a float32 or bfloat16 weight, in float32."""
    if weight.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"f32_gemm reads float32 or bfloat16 weights, got {weight.dtype}")
    n, k = weight.shape
    rows = float_rows(x)
    packed = PACKED.get(weight, lambda: _pack(weight))
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    b = None if bias is None else bias.float().contiguous()
    if rows.shape[0]:
        status = kernel("f32_gemm", "f32_gemm", ARGS, ctypes.c_int)(
            rows.data_ptr(), rows.shape[0], k, packed.data_ptr(), n, None if b is None else b.data_ptr(),
            out.data_ptr(), torch.get_num_threads())
        if status:
            raise RuntimeError("f32_gemm: this build has no AVX2 and FMA")
    return shaped(out, x)
