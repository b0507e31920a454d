"""The bfloat16 GEMM on Intel AMX (`amx_linear.c`): a CPU bf16 model's projections past the exact GEMV's rows.

oneDNN's bf16 GEMM also runs on AMX, but on a small model's shapes at a few rows it streams the weights at ~60% of
what this kernel does: each weight packed once into AMX's pair layout and streamed past x's tiles, the next column
pair's weights prefetched. SmolLM2-135M's projections (benchmarks/reports/cpu_amx_gemm.md): 16 rows 1.65x oneDNN
(decode of 16 streams: 14 GB/s of weights where a plain sum reads 21), 64-128 rows 1.3-1.4x; past 512 rows oneDNN's
blocking does as well or better and takes them (`MAX_ROWS`).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from layerzero.kernels.native.build import kernel
from layerzero.kernels.weight_cache import WeightCache

KSTEP = 32  # inputs per tile row: K must be a multiple
COLS = 16  # outputs per tile: N is padded to a multiple in the packed copy
# most rows it takes: past them oneDNN's bf16 GEMM is as fast or faster (GEMMs alone: 256-512 rows 0.9-1.1x oneDNN,
# 2,048 0.5-1.2x between runs, benchmarks/reports/cpu_amx_gemm.md; whole prefills of 512 rows 1.13x, 2,048 ~1.0x)
MAX_ROWS = 512

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
PACK_ARGS = (_P, _I64, _I64, _P)
ARGS = (_P, _I64, _I64, _P, _I64, _P, _P, ctypes.c_int, ctypes.c_int)

PACKED: WeightCache[torch.Tensor] = WeightCache()  # each bf16 weight in AMX's pair layout


@functools.cache
def available() -> bool:
    """Whether this build runs AMX here (the compiler targets a CPU with AMX-BF16 and Linux grants the tiles)."""
    return bool(kernel("amx_linear", "amx_available", (), ctypes.c_int)())


def _pack(weight: torch.Tensor) -> torch.Tensor:
    n, k = weight.shape
    w = weight.detach().contiguous()
    packed = torch.empty(-(-n // COLS) * COLS * k, dtype=torch.bfloat16)
    if kernel("amx_linear", "amx_pack", PACK_ARGS, ctypes.c_int)(w.data_ptr(), n, k, packed.data_ptr()):
        raise ValueError(f"amx_pack: {k} inputs is not a multiple of {KSTEP}")
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T + bias for a bf16 weight, multiplied in bf16 with float32 sums: bf16 x gives bf16
    (rounded to nearest even), float32 x is rounded to bf16 for the product and gives float32."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    half = rows.to(torch.bfloat16).contiguous()
    packed = PACKED.get(weight, lambda: _pack(weight))
    out = torch.empty(rows.shape[0], n, dtype=x.dtype)
    b = None if bias is None else bias.float().contiguous()
    if rows.shape[0]:
        status = kernel("amx_linear", "amx_linear", ARGS, ctypes.c_int)(
            half.data_ptr(), rows.shape[0], k, packed.data_ptr(), n, None if b is None else b.data_ptr(),
            out.data_ptr(), int(x.dtype == torch.bfloat16), torch.get_num_threads())
        if status:
            raise RuntimeError(f"amx_linear failed (status {status}): no AMX here or {k} inputs")
    return out.view(*x.shape[:-1], n)
