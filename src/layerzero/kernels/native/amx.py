"""The bfloat16 GEMM on Intel AMX (`amx_linear.c`): a CPU bf16 model's projections past the exact GEMV's rows.

oneDNN's bf16 GEMM also runs on AMX, but on a small model's shapes it reached 150-255 GFLOP/s at 16 rows and 410-570
at 128 on a 2-core Xeon whose AMX units do ~2,000 a core: it repacks nothing (its copy is packed) yet spends its
time around the tiles. This kernel packs each weight once into AMX's pair layout and streams it past x's tiles:
the bundled model's projections at 16 rows 19.2 -> 5.2 ms, at 128 rows 53.6 -> 17.5 ms (docs/engine.md).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from layerzero.kernels.native.build import kernel
from layerzero.kernels.weight_cache import WeightCache

KSTEP = 32  # inputs per tile row: K must be a multiple
COLS = 16  # outputs per tile: N is padded to a multiple in the packed copy

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
