"""The native weight-only linears: float32 activations times 4-bit groups, straight from the packed nibbles, times
int8 weights with per-block scales (GGUF Q8_0), and times bfloat16 weights (`--dtype bfloat16` on the CPU: oneDNN's
bf16 GEMV reached 11 GB/s of a 28 GB/s machine on the bundled model's small weights, this one streams them).

torch's packed int4 kernel multiplies in bfloat16, so it needs two passes of x, a separate float32 product for the
groups' zeros and a dozen small aten ops around each call; at batch 1 on the bundled SmolLM2 those cost more than
the kernel itself. This one computes (q * scale + zero) . x in float32 in one C call that streams each weight
once (docs/quantization.md, "CPU kernels"); the 8-bit form likewise. Each row of x gets the same arithmetic
whatever shares its call, so a request decodes the same tokens alone or in a batch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import NamedTuple

import torch

from layerzero.kernels.native.build import kernel, vector_isa
from layerzero.kernels.weight_cache import WeightCache

CHUNK = 32  # the 4-bit kernel reads whole 32-column chunks of a group
HALF = 16  # the 8-bit kernel reads 16 columns at a time


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
W8_ARGS = (_P, _I64, _I64, _P, _I64, _P, _I64, _P, _P, ctypes.c_int)
DENSE_ARGS = (_P, _I64, _I64, _P, _I64, _P, _P, ctypes.c_int)  # bf16_linear and f32_linear
# Most rows the GEMVs take; more are a GEMM's. With AVX-512, 4: oneDNN's float32 GEMM is faster past them
# (benchmarks/reports/cpu_f32_gemv.md) and its bf16 one (AMX) ran a 128-row prefill's projections 5-9x faster than
# the bf16 GEMV, 2x at 8 rows. An AVX2 CPU has no bf16 GEMM (bf16 weights run in float32 there) and its GEMV keeps a
# block of weights in L1 across the rows' tiles: 16 rows of SmolLM2's projections 1.3x oneDNN's float32 GEMM in
# float32, ~1.7x in bf16 (half the bytes), and 0.9x at 32 (docs/quantization.md, "AVX2").
F32_MAX_ROWS = 16 if vector_isa() == "AVX2" else 4
BF16_MAX_ROWS = F32_MAX_ROWS  # also where a CPU bf16 model's blocks start keeping bf16 rows (Block.half_rows)


def _kernel(extra: tuple[str, ...] = ()) -> Callable[..., int]:
    return kernel("quant_linear", "int4_linear", ARGS, ctypes.c_int, extra)


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
                *, group_size: int, _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """x [..., K] @ W.T + bias for W [N, K] stored as qweight [N, K/2] nibbles and scales_zeros [K/group, N, 2]."""
    entry = CONVERTED.get(qweight, lambda: _convert(scales_zeros))
    n, k = qweight.shape[0], x.shape[-1]
    rows = float_rows(x)
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    # every tensor whose pointer C reads is held in a local until the call returns
    q, b = qweight.contiguous(), None if bias is None else bias.float().contiguous()
    if rows.shape[0]:
        status = _kernel(_extra)(rows.data_ptr(), rows.shape[0], k, q.data_ptr(), n,
                                 entry.scales.data_ptr(), entry.zeros8.data_ptr(), group_size,
                                 None if b is None else b.data_ptr(), out.data_ptr(), torch.get_num_threads())
        if status:
            raise MemoryError(f"native int4 linear: no scratch memory for {rows.shape[0]} x {k} activations")
    return shaped(out, x)


def float_rows(x: torch.Tensor) -> torch.Tensor:
    """x as the contiguous float32 [rows, K] the native linears read."""
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    return rows if rows.dtype == torch.float32 and rows.is_contiguous() else rows.float().contiguous()


def shaped(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A native linear's float32 rows `out` in x's dtype and leading shape."""
    if x.dtype != torch.float32:
        out = out.to(x.dtype)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])


def linear_w8_int8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, *,
                   block_size: tuple[int, int], _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """x [..., K] @ W.T + bias for an int8 W [N, K] with one float32 scale per row and block of columns,
    scale [N, K / block] (GGUF Q8_0: blocks of 32; per channel: one block of K)."""
    n, k = weight.shape
    rows = float_rows(x)
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    w, s = weight.contiguous(), scale.float().contiguous()
    b = None if bias is None else bias.float().contiguous()
    if rows.shape[0]:
        kernel("quant_linear", "int8_linear", W8_ARGS, ctypes.c_int, _extra)(
            rows.data_ptr(), rows.shape[0], k, w.data_ptr(), n, s.data_ptr(), block_size[1],
            None if b is None else b.data_ptr(), out.data_ptr(), torch.get_num_threads())
    return shaped(out, x)


def _dense(symbol: str, dtype: torch.dtype, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           extra: tuple[str, ...]) -> torch.Tensor:
    """x [..., K] float32 @ W.T + bias for a dense W [N, K] of `dtype` (K a multiple of 16), in float32."""
    if weight.dtype != dtype:
        raise TypeError(f"{symbol} reads {str(dtype).removeprefix('torch.')} weights, got {weight.dtype}")
    n, k = weight.shape
    rows = float_rows(x)
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    w, b = weight.contiguous(), None if bias is None else bias.float().contiguous()
    if rows.shape[0]:
        kernel("quant_linear", symbol, DENSE_ARGS, ctypes.c_int, extra)(
            rows.data_ptr(), rows.shape[0], k, w.data_ptr(), n, None if b is None else b.data_ptr(), out.data_ptr(),
            torch.get_num_threads())
    return shaped(out, x)


def linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """x [..., K] float32 @ W.T + bias for a bfloat16 W [N, K] (K a multiple of 16), in float32."""
    return _dense("bf16_linear", torch.bfloat16, x, weight, bias, _extra)


def linear_f32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               _extra: tuple[str, ...] = ()) -> torch.Tensor:
    """x [..., K] float32 @ W.T + bias for a float32 W [N, K] (K a multiple of 16): the bf16 GEMV's loop over the
    weights as they are, for the few rows of a float32 model's decode."""
    return _dense("f32_linear", torch.float32, x, weight, bias, _extra)
