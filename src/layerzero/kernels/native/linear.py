"""The native 4-bit linear: float32 activations times 4-bit groups, straight from the packed nibbles.

torch's packed int4 kernel multiplies in bfloat16, so it needs two passes of x, a separate float32 product for the
groups' zeros and a dozen small aten ops around each call; at batch 1 on the bundled SmolLM2 those cost more than
the kernel itself. This one computes (q * scale + zero) . x in float32 in one C call that streams each weight
once (docs/quantization.md, "CPU kernels"). Each row of x gets the same arithmetic whatever shares its call, so
a request decodes the same tokens alone or in a batch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import NamedTuple

import torch

from layerzero.kernels.native.build import kernel
from layerzero.kernels.weight_cache import WeightCache

CHUNK = 32  # the kernel reads whole 32-column chunks of a group


class _Converted(NamedTuple):
    scales: torch.Tensor  # [N, K/group] float32
    zeros8: torch.Tensor  # [N, K/group] float32: zero - 8 * scale, so W = q * scale + zeros8


def _convert(scales_zeros: torch.Tensor) -> _Converted:
    sz = scales_zeros.float().transpose(0, 1)  # [N, K/group, 2]
    scales, zeros = sz[..., 0].contiguous(), sz[..., 1]
    return _Converted(scales, (zeros - 8 * scales).contiguous())


CONVERTED: WeightCache[_Converted] = WeightCache()  # by the identity of qweight


_P, _I64 = ctypes.c_void_p, ctypes.c_int64
ARGS = (_P, _I64, _I64, _P, _I64, _P, _P, _I64, _P, _P, ctypes.c_int)


def _kernel(extra: tuple[str, ...] = ()) -> Callable[..., int]:
    return kernel("int4_linear", "int4_linear", ARGS, ctypes.c_int, extra)


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
                *, group_size: int, _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """x [..., K] @ W.T + bias for W [N, K] stored as qweight [N, K/2] nibbles and scales_zeros [K/group, N, 2]."""
    entry = CONVERTED.get(qweight, lambda: _convert(scales_zeros))
    n, k = qweight.shape[0], x.shape[-1]
    rows = x if x.dim() == 2 else x.reshape(-1, k)
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.float().contiguous()
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    b = None if bias is None else bias.float().contiguous()
    if rows.shape[0]:
        status = _kernel(_extra)(rows.data_ptr(), rows.shape[0], k, qweight.contiguous().data_ptr(), n,
                                 entry.scales.data_ptr(), entry.zeros8.data_ptr(), group_size,
                                 None if b is None else b.data_ptr(), out.data_ptr(), torch.get_num_threads())
        if status:
            raise MemoryError(f"native int4 linear: no scratch memory for {rows.shape[0]} x {k} activations")
    if x.dtype != torch.float32:
        out = out.to(x.dtype)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], n)
